import sys
from argparse import Namespace
from pathlib import Path

import pytest
import sentencepiece

from fairseq_linattn.data import find_fairseq_preprocess, spm
from fairseq_linattn.data.inputs import InputError


def _hub_bpe(model: Path):
    """The BPE object a hub interface builds from ``bpe="sentencepiece", sentencepiece_model=...``."""
    from fairseq.data.encoders import build_bpe

    return build_bpe(Namespace(bpe="sentencepiece", sentencepiece_model=str(model)))


def test_training_is_deterministic_also_when_sampling_lines(corpus_dir, tmp_path):
    train = corpus_dir / "train.txt"
    lines = [line for line in train.read_text(encoding="utf-8").splitlines(keepends=True) if line.strip()]
    sample = spm.sample_lines([train], 1000, seed=7)
    assert sample == spm.sample_lines([train], 1000, seed=7) != spm.sample_lines([train], 1000, seed=8)
    assert len(sample) == 1000 and set(sample) <= set(lines)
    assert spm.sample_lines([train], len(lines), seed=7) is None  # everything fits: no sampling

    first = spm.train_sentencepiece([train], tmp_path / "sp", 600, input_sentence_size=1000, seed=7).read_bytes()
    second = spm.train_sentencepiece([train], tmp_path / "sp", 600, input_sentence_size=1000, seed=7).read_bytes()
    assert first == second
    assert sentencepiece.SentencePieceProcessor(model_proto=first).get_piece_size() == 600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sp.model", "sp.vocab"]  # the sample file is gone


def test_encode_file_round_trips_and_keeps_empty_lines(spm_model, corpus_dir, tmp_path):
    source = corpus_dir / "valid.txt"
    lines = source.read_text(encoding="utf-8").splitlines()
    assert spm.encode_file(spm_model, source, tmp_path / "valid.spm") == len(lines)
    encoded = (tmp_path / "valid.spm").read_text(encoding="utf-8").splitlines()
    assert len(encoded) == len(lines) and "" in lines
    processor = spm.load_model(spm_model)
    bpe = _hub_bpe(spm_model)
    for line, pieces in zip(lines, encoded):
        assert (pieces == "") == (line == "")
        # Text comes back as sentencepiece normalised it (NFKC, single spaces), which for ASCII is the line itself.
        assert bpe.decode(pieces) == processor.normalize(line).replace("\u2581", " ").strip()
        if line.isascii():
            assert bpe.decode(pieces) == line


def test_hub_sentencepiece_bpe_gives_the_same_pieces(spm_model, corpus_dir):
    lines = (corpus_dir / "test.txt").read_text(encoding="utf-8").splitlines()
    bpe = _hub_bpe(spm_model)
    assert spm.encode_lines(spm_model, lines) == [bpe.encode(line) for line in lines]


def test_binarized_ids_match_hub_encoding(lm_databin, corpus_dir):
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(lm_databin / "dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(lm_databin / "valid"), dictionary)
    lines = (corpus_dir / "valid.txt").read_text(encoding="utf-8").splitlines()
    assert len(dataset) == len(lines)
    bpe = _hub_bpe(lm_databin / "sentencepiece.bpe.model")
    for i in range(0, len(lines), 7):
        # RobertaHubInterface.encode: "<s> " + bpe.encode(text) + " </s>", looked up without adding words.
        hub = dictionary.encode_line("<s> " + bpe.encode(lines[i]) + " </s>", append_eos=False, add_if_not_exist=False)
        assert hub[1:-1].tolist() == dataset[i][:-1].tolist()


def test_vocab_too_large_names_the_limit_and_the_fixes(tmp_path):
    text = tmp_path / "tiny.txt"
    text.write_text("a tiny text\nwith few distinct pieces\n" * 20, encoding="utf-8")
    with pytest.raises(spm.VocabTooLargeError, match=r"vocab_size=5000 .*at most \d+ pieces.*--soft-vocab-limit"):
        spm.train_sentencepiece([text], tmp_path / "sp", 5000)
    model = spm.train_sentencepiece([text], tmp_path / "sp", 5000, hard_vocab_limit=False)
    assert spm.load_model(model).get_piece_size() < 5000
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        spm.train_sentencepiece([tmp_path / "missing.txt"], tmp_path / "sp", 100)


def test_empty_text_other_encodings_a_too_small_vocabulary_and_other_files_are_input_errors(tmp_path):
    """What sentencepiece ends with a RuntimeError on (or Python with a UnicodeDecodeError) names the file and the fix."""
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(InputError, match=r"empty.txt: empty \(or no text lines\): sentencepiece needs text"):
        spm.train_sentencepiece([tmp_path / "empty.txt"], tmp_path / "sp", 100)
    (tmp_path / "latin1.txt").write_bytes("café au lait\n".encode("latin1") * 20)
    with pytest.raises(InputError, match=r"latin1.txt is not UTF-8 text \(b'\\xe9' cannot be decoded\): convert it"):
        spm.train_sentencepiece([tmp_path / "latin1.txt"], tmp_path / "sp", 100)
    text = tmp_path / "text.txt"
    text.write_text("a tiny text\nwith few distinct pieces\n" * 20, encoding="utf-8")
    with pytest.raises(InputError, match=r"vocab_size=8 is too small .*characters alone take \d+ pieces.*--vocab-size"):
        spm.train_sentencepiece([text], tmp_path / "sp", 8)
    model = spm.train_sentencepiece([text], tmp_path / "sp", 20)
    with pytest.raises(InputError, match="latin1.txt is not UTF-8 text"):
        spm.encode_file(model, tmp_path / "latin1.txt", tmp_path / "out.spm")
    with pytest.raises(InputError, match=rf"{text} is not a sentencepiece model \(INTERNAL: could not parse"):
        spm.load_model(text)


def test_cli_trains_and_encodes(corpus_dir, tmp_path, capsys):
    spm.main(["train", "--inputs", str(corpus_dir / "valid.txt"), "--model-prefix", str(tmp_path / "m"),
              "--vocab-size", "300"])
    assert (tmp_path / "m.model").is_file() and (tmp_path / "m.vocab").is_file()
    spm.main(["encode", "--model", str(tmp_path / "m.model"), "--inputs", str(corpus_dir / "test.txt"),
              "--outputs", str(tmp_path / "test.spm")])
    assert "300 pieces" in capsys.readouterr().out
    assert (tmp_path / "test.spm").read_text(encoding="utf-8").count("\n") == len(
        (corpus_dir / "test.txt").read_text(encoding="utf-8").splitlines())


def test_fairseq_preprocess_is_taken_from_the_interpreters_environment():
    assert Path(find_fairseq_preprocess()) == Path(sys.executable).parent / "fairseq-preprocess"


def test_lm_databin_loads_for_masked_lm_and_language_modeling(lm_databin):
    from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
    from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask

    assert {"dict.txt", "sentencepiece.bpe.model"} <= {p.name for p in lm_databin.iterdir()}
    masked = MaskedLMTask.setup_task(MaskedLMConfig(data=str(lm_databin), tokens_per_sample=64, seed=1))
    # Config fields that are ${...} interpolations outside of a full hydra config are set explicitly.
    causal = LanguageModelingTask.setup_task(LanguageModelingConfig(
        data=str(lm_databin), tokens_per_sample=64, sample_break_mode="complete_doc", seed=1,
        max_target_positions=64, dataset_impl="mmap", data_buffer_size=2, tpu=False, use_plasma_view=False,
    ))
    for task in (masked, causal):
        for split in ("train", "valid", "test"):
            task.load_dataset(split)
            assert len(task.datasets[split]) > 0
    assert masked.source_dictionary.index("<mask>") == len(masked.source_dictionary) - 1


def test_lm_databin_was_made_by_the_cli_with_a_trained_model(lm_databin):
    assert spm.load_model(lm_databin / "sentencepiece.bpe.model").get_piece_size() == 1000  # conftest's size
    for split in ("train", "valid", "test"):
        assert (lm_databin / f"{split}.bin").is_file() and (lm_databin / f"{split}.idx").is_file()


def test_prepare_lm_data_reuses_a_model_and_a_dictionary(prepare_lm_data_script, corpus_dir, lm_databin, tmp_path,
                                                         monkeypatch):
    """The reuse path, with the binarizer stubbed out (the session's data-bin ran the real one)."""
    calls = []
    monkeypatch.setattr(prepare_lm_data_script, "run_fairseq_preprocess", lambda *invocations: calls.extend(invocations))
    with pytest.raises(SystemExit) as help_exit:
        prepare_lm_data_script.main(["--help"])
    assert help_exit.value.code == 0
    model = lm_databin / "sentencepiece.bpe.model"
    prepare_lm_data_script.main(["--train", str(corpus_dir / "train.txt"), "--valid", str(corpus_dir / "valid.txt"),
                                 "--destdir", str(tmp_path), "--spm-model", str(model),
                                 "--srcdict", str(lm_databin / "dict.txt")])
    assert (tmp_path / "sentencepiece.bpe.model").read_bytes() == model.read_bytes()
    [args] = calls
    assert args[:1] == ["--only-source"] and "--testpref" not in args
    assert args[args.index("--srcdict") + 1] == str(lm_databin / "dict.txt")
