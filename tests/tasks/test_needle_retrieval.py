"""--task needle_retrieval: needle documents of the length asked, made the same from the same seed, scored at the answer
only (its tokens are the number the needle hides), haystacks in turn; a data folder without what the task needs, or
another criterion, is one line when the command line is parsed."""
from argparse import Namespace

import pytest
import sentencepiece
import torch
from fairseq import options
from fairseq.data import Dictionary, indexed_dataset

from fairseq_linattn.tasks.needle import FILLER, INSTRUCTION, needle, question
from fairseq_linattn.tasks.needle_retrieval import NeedleRetrievalTask
from tests.compat.test_cli_checks import parse_error

TEXT = "First one here. Second one there. Third one is longer than the others. "


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A language-modelling data folder as the studies write one: sentencepiece model, dict.txt, a binarized split."""
    folder = tmp_path_factory.mktemp("needle-data")
    lines = [FILLER, INSTRUCTION, needle("apple", "0123456789"), question("apple"), TEXT] * 20
    (folder / "text.txt").write_text("\n".join(lines))
    sentencepiece.SentencePieceTrainer.train(input=str(folder / "text.txt"), model_prefix=str(folder / "sentencepiece.bpe"),
                                             vocab_size=120, model_type="bpe", character_coverage=1.0,
                                             minloglevel=2)
    model = sentencepiece.SentencePieceProcessor(model_file=str(folder / "sentencepiece.bpe.model"))
    dictionary = Dictionary()
    for piece in (model.id_to_piece(i) for i in range(model.get_piece_size())):
        dictionary.add_symbol(piece)
    dictionary.save(str(folder / "dict.txt"))
    for split in ("train", "valid"):
        builder = indexed_dataset.make_builder(str(folder / f"{split}.bin"), impl="mmap", vocab_size=len(dictionary))
        for line in [TEXT * 3] * 4:
            builder.add_item(dictionary.encode_line(" ".join(model.encode(line, out_type=str)),
                                                    add_if_not_exist=False))
        builder.finalize(str(folder / f"{split}.idx"))
    return folder


def task_of(data, **overrides):
    args = Namespace(data=str(data), tokens_per_sample=240, train_documents=8, valid_documents=4, needle_seed=1,
                     output_dictionary_size=-1, dataset_impl=None, add_bos_token=False, **overrides)
    return NeedleRetrievalTask.setup_task(args)


def test_documents_are_the_length_asked_and_scored_at_the_answer_only(data):
    task = task_of(data)
    task.load_dataset("train")
    dataset, dictionary = task.datasets["train"], task.dictionary
    pad = dictionary.pad()
    for index in range(4):
        item = dataset[index]
        source, target = item["source"], item["target"]
        assert len(source) == len(target) == 240 and source[0] == dictionary.eos()
        scored = target.ne(pad).nonzero().flatten()
        assert scored.tolist() == list(range(240 - len(scored), 240))  # the answer: the last positions only
        assert torch.equal(source[scored[1:]], target[scored[:-1]])  # the next token, teacher-forced
        said = dictionary.string(target[scored]).replace(" ", "").replace("▁", "")
        number = said.rstrip(".")
        assert said.endswith(".") and len(number) == 7 and number.isdigit()
        prompt = dictionary.string(source[1:scored[0] + 1]).replace(" ", "").replace("▁", " ")
        assert f"is: {number}." in prompt and prompt.endswith("is:")  # the needle hides it; the question asks
        assert ("grass" in prompt) == (index % 2 == 0)  # filler, text, filler, text
    batch = dataset.collater([dataset[0], dataset[1]])
    assert batch["ntokens"] == int(batch["target"].ne(pad).sum()) and batch["net_input"]["src_tokens"].shape == (2, 240)


def test_the_same_seed_makes_the_same_documents_and_another_split_others(data):
    first, second = task_of(data), task_of(data)
    for task in (first, second):
        task.load_dataset("train")
        task.load_dataset("valid")
    assert torch.equal(first.datasets["train"][3]["source"], second.datasets["train"][3]["source"])
    assert not torch.equal(first.datasets["train"][3]["source"], first.datasets["valid"][3]["source"])


def test_a_folder_without_the_sentencepiece_model_is_named(tmp_path, data):
    (tmp_path / "dict.txt").write_text((data / "dict.txt").read_text())
    with pytest.raises(ValueError, match="needs a language-modelling data folder with sentencepiece.bpe.model"):
        task_of(tmp_path)


@pytest.mark.parametrize("flags,message", [
    (["--criterion", "cross_entropy"], "use --criterion associative_recall, not cross_entropy"),
    (["--train-documents", "0"], "--train-documents must be at least 1, got 0"),
    (["--tokens-per-sample", "40"], "--tokens-per-sample 40 holds no needle document: its words alone take"),
])
def test_mistakes_are_one_line_when_the_command_line_is_parsed(monkeypatch, capsys, data, flags, message):
    argv = ["fairseq-train", str(data), "--task", "needle_retrieval", "--criterion", "associative_recall", "--arch",
            "linear_transformer_lm", *flags]
    line = parse_error(monkeypatch, capsys, options.get_training_parser, *argv)
    assert line.startswith("fairseq-train: error: ") and message in line, line


def test_a_folder_that_is_no_lm_data_is_one_line(monkeypatch, capsys, tmp_path):
    argv = ["fairseq-train", str(tmp_path), "--task", "needle_retrieval", "--criterion", "associative_recall",
            "--arch", "linear_transformer_lm"]
    line = parse_error(monkeypatch, capsys, options.get_training_parser, *argv)
    assert "needs a language-modelling data folder with dict.txt" in line, line
