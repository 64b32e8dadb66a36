"""A good guest: with the plugin imported, fairseq's own models behave as fairseq made them (compat/__init__.py's rule).
What fairseq's own tests found altered, pinned here in-process: TorchScript over a SequenceGenerator, fairseq's reader
of interactive lines with a text stream, fairseq's checkpoint loading under a mocked file system; and the scope that
decides where the plugin's behaviour changes apply. The command lines: tests/e2e/test_good_guest.py."""
import io
import logging
import sys
from argparse import Namespace
from unittest.mock import MagicMock, patch

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.data import Dictionary, EpochBatchIterator, LanguagePairDataset, TokenBlockDataset
from fairseq.models.transformer import TransformerModel
from fairseq.sequence_generator import SequenceGenerator
from omegaconf import OmegaConf

import fairseq_linattn  # noqa: F401  (the fixes are in place)
from fairseq_linattn.compat import generation, interactive, scope
from fairseq_linattn.models.plugin_model import NotScriptableError
from fairseq_linattn.models.standalone import DictionaryTask, build_model
from tests.pages import ROOT

OUR_CHECKPOINT = str(ROOT / "tests" / "checkpoints" / "v0_1" / "linear_transformer_lm.pt")
TINY = dict(encoder_layers=1, decoder_layers=1, encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=16,
            decoder_ffn_embed_dim=16, encoder_attention_heads=2, decoder_attention_heads=2)


def test_scope_names_our_runs_and_only_ours(monkeypatch):
    monkeypatch.delenv(scope.OPT_IN_VARIABLE, raising=False)
    assert scope.names_ours(Namespace(arch="linear_transformer_lm", task="language_modeling"))
    assert scope.names_ours(Namespace(arch="transformer_lm", task="associative_recall"))  # our task
    assert not scope.names_ours(Namespace(arch="transformer_lm", task="language_modeling", criterion="cross_entropy"))
    cfg = OmegaConf.create({"model": {"_name": "linformer_roberta"}, "task": {"_name": "masked_lm"}})
    assert scope.names_ours(cfg)
    cfg = OmegaConf.create({"model": {"_name": "roberta"}, "task": {"_name": "masked_lm"}, "common_eval": {"path": None}})
    assert not scope.names_ours(cfg)
    assert scope.names_ours(Namespace(path=OUR_CHECKPOINT, task="language_modeling"))  # a checkpoint of ours
    assert not scope.names_ours(Namespace(path="/no/such/checkpoint.pt"))
    assert not scope.names_ours(MagicMock())  # a test's mock names nothing (fairseq's own tests pass one)
    assert not scope.applies(cfg=Namespace(arch="transformer_lm"))
    with scope.run(Namespace(arch="linear_transformer_lm")):
        assert scope.applies()
    assert not scope.applies()
    monkeypatch.setenv(scope.OPT_IN_VARIABLE, "1")
    assert scope.applies(cfg=Namespace(arch="transformer_lm")) and scope.applies()


def fairseq_transformer(task):
    args = Namespace(**TINY, arch="transformer")
    from fairseq.models.transformer import transformer_legacy

    transformer_legacy.base_architecture(args)
    return TransformerModel.build_model(args, task)


def test_torchscript_compiles_a_sequence_generator_over_fairseqs_transformer():
    """Our length check wrapped SequenceGenerator._generate, which TorchScript compiles with forward: scripting failed
    for every model ("undefined value torch"). It is in generate now, and the scripted generator decodes as the eager
    one."""
    task = DictionaryTask(vocab_size=20)
    torch.manual_seed(0)
    model = fairseq_transformer(task).eval()
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=2, max_len_b=6)
    scripted = torch.jit.script(generator)
    eos = task.target_dictionary.eos()
    sample = {"net_input": {"src_tokens": torch.tensor([[5, 6, 7, eos], [8, 9, eos, 1]]),
                            "src_lengths": torch.tensor([4, 3])}}
    eager = generator.forward(sample)
    compiled = scripted.forward(sample)
    for a, b in zip(eager, compiled):
        assert torch.equal(a[0]["tokens"], b[0]["tokens"])
    assert SequenceGenerator._generate.__module__ == "fairseq.sequence_generator"  # fairseq's own, unwrapped


@pytest.mark.parametrize("arch", ["linear_transformer_tiny", "linear_transformer_lm"])
def test_torchscript_over_our_models_is_refused_in_one_line(arch):
    task = DictionaryTask(vocab_size=20)
    model = build_model(arch, task, **TINY)
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=2)
    with pytest.raises(NotScriptableError) as refused:
        torch.jit.script(generator)
    message = str(refused.value)
    assert "\n" not in message and "cannot be compiled by TorchScript" in message, message
    assert message.startswith(arch.replace("_tiny", ""))


def test_the_length_warning_is_for_our_models_unless_opted_in(monkeypatch, caplog):
    """fairseq's own models generate silently capped, as fairseq made them; ours say so."""
    monkeypatch.delenv(scope.OPT_IN_VARIABLE, raising=False)
    task = DictionaryTask(vocab_size=20, max_positions=16)
    eos = task.target_dictionary.eos()
    sample = {"net_input": {"src_tokens": torch.tensor([[5, 6, eos]]), "src_lengths": torch.tensor([3])}}
    fairseqs = SequenceGenerator([fairseq_transformer(task).eval()], task.target_dictionary, max_len_b=5000)
    with caplog.at_level(logging.WARNING, logger=generation.logger.name):
        generation.check_length(fairseqs, sample)
    assert not caplog.records
    monkeypatch.setenv(scope.OPT_IN_VARIABLE, "1")
    with caplog.at_level(logging.WARNING, logger=generation.logger.name):
        generation.check_length(fairseqs, sample)
    assert "generating at most" in caplog.text and "decode as an RNN" not in caplog.text  # no advice for softmax
    monkeypatch.delenv(scope.OPT_IN_VARIABLE)
    caplog.clear()
    ours = SequenceGenerator([build_model("linear_transformer_tiny", task, **TINY).eval()], task.target_dictionary,
                             max_len_b=5000)
    with caplog.at_level(logging.WARNING, logger=generation.logger.name):
        generation.check_length(ours, sample)
    assert "generating at most" in caplog.text and "max_target_positions" in caplog.text


def test_interactive_reads_a_text_stream_as_fairseq_does_and_as_we_do(monkeypatch, tmp_path):
    """fairseq's tests put a StringIO in place of stdin: our reader took sys.stdin.buffer (AttributeError). Outside our
    runs fairseq's reader reads; in ours, a text stream is read as it is (nothing to decode)."""
    import fairseq_cli.interactive

    monkeypatch.delenv(scope.OPT_IN_VARIABLE, raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO("h e l l o\n w o r l d \n"))
    assert list(fairseq_cli.interactive.buffered_read("-", 1)) == [["h e l l o"], ["w o r l d"]]
    monkeypatch.setattr(sys, "stdin", io.StringIO("h e l l o\n w o r l d \n"))
    with scope.run(Namespace(arch="linear_transformer_lm")):
        buffers = list(fairseq_cli.interactive.buffered_read("-", 1))
    assert buffers == [["h e l l o"], ["w o r l d"]] and [b.first for b in buffers] == [1, 2]
    assert interactive.buffered_read.__module__ == interactive.__name__


def mocked_trainer(epoch_size=30, epoch=2, iterations_in_epoch=10):
    """A trainer that "loads" a checkpoint from the middle of epoch 2, as fairseq's TestLoadCheckpoint mocks it."""
    tokens = torch.arange(epoch_size).view(1, -1)
    blocks = TokenBlockDataset(tokens, sizes=[epoch_size], block_size=1, pad=0, eos=1, include_targets=False)
    dictionary = Dictionary()
    dataset = LanguagePairDataset(blocks, blocks.sizes, dictionary, shuffle=False)
    trainer = MagicMock()
    trainer.load_checkpoint.return_value = {"train_iterator": {"epoch": epoch, "iterations_in_epoch": iterations_in_epoch,
                                                               "shuffle": False}}
    trainer.get_train_iterator.return_value = EpochBatchIterator(
        dataset=dataset, collate_fn=dataset.collater, batch_sampler=[[i] for i in range(epoch_size)])
    return trainer


def test_fairseqs_checkpoint_loading_under_a_mocked_file_system():
    """fairseq's TestLoadCheckpoint mocks os.path and PathManager and hands a MagicMock trainer: our resume wrapper
    read real files and cfg.no_last_checkpoints and failed. For a run that is not ours it is fairseq's function."""
    cfg = OmegaConf.create({"checkpoint": {
        "save_dir": None, "optimizer_overrides": "{}", "reset_dataloader": False, "reset_meters": False,
        "reset_optimizer": False, "reset_lr_scheduler": False, "finetune_from_model": None, "model_parallel_size": 1,
        "restore_file": "checkpoint_last.pt"}})
    mocks = {"os.makedirs": MagicMock(), "os.path.join": MagicMock(), "os.path.isfile": MagicMock(return_value=True),
             "os.path.isabs": MagicMock(return_value=False),
             "fairseq.file_io.PathManager.exists": MagicMock(return_value=False)}
    trainer = mocked_trainer()
    started = [patch(target, mock) for target, mock in mocks.items()]
    for mock in started:
        mock.start()
    try:
        _, epoch_itr = checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    finally:
        patch.stopall()
    assert (epoch_itr.epoch, epoch_itr.iterations_in_epoch) == (2, 10)
    assert trainer.load_checkpoint.called
