"""linear_transformer_lm and linear_roberta through the real command lines: train, eval-lm (with a context
window), generate with beam search, interactive, hydra, the hub's sample()."""
import re
import shutil

import pytest

from .cli import COMMON, USER_DIR, run, train_lm


@pytest.fixture(scope="module")
def linear_lm(spm_data, tmp_path_factory):
    data, spm_model = spm_data
    save = tmp_path_factory.mktemp("linear_lm")
    log = train_lm(data, save, "--chunk-size", "16")
    assert "KernelAttention(" in log and "causal=True, chunk_size=16" in log
    shutil.copy(spm_model, save / "sentencepiece.bpe.model")
    return save


def test_eval_lm_with_and_without_context_window(spm_data, linear_lm):
    data, _ = spm_data
    ppl = {}
    for window in ("0", "32"):
        log = run("fairseq-eval-lm", data, "--user-dir", USER_DIR, "--path", linear_lm / "checkpoint_last.pt",
                  "--cpu", "--gen-subset", "test", "--tokens-per-sample", "64", "--context-window", window,
                  "--batch-size", "4")
        ppl[window] = float(re.findall(r"Perplexity: ([0-9.]+)", log)[-1])
    assert all(1 < p < 10_000 for p in ppl.values())
    assert ppl["0"] != ppl["32"]  # the context window really changed what the model conditions on


def test_generate_with_beam_search(spm_data, linear_lm):
    data, _ = spm_data
    log = run("fairseq-generate", data, "--user-dir", USER_DIR, "--task", "language_modeling", "--path",
              linear_lm / "checkpoint_last.pt", "--cpu", "--beam", "4", "--nbest", "2", "--batch-size", "4",
              "--max-len-b", "12", "--prefix-size", "2", "--gen-subset", "test", "--sample-break-mode", "eos",
              "--tokens-per-sample", "64", "--skip-invalid-size-inputs-valid-test", "--max-sentences", "4")
    hypotheses = re.findall(r"^H-(\d+)\t(-?[0-9.]+)\t(.*)$", log, flags=re.M)
    assert len(hypotheses) >= 8, log[-2000:]
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", log, flags=re.M))
    for idx, _, text in hypotheses:  # the prefix is kept: generation continued the given tokens
        assert text.split()[:2] == sources[idx].split()[:2]


def test_interactive(spm_data, linear_lm):
    data, _ = spm_data
    import os
    import subprocess
    import sys

    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-interactive")
    proc = subprocess.run([exe, str(data), "--user-dir", USER_DIR, "--task", "language_modeling", "--path",
                           str(linear_lm / "checkpoint_last.pt"), "--cpu", "--beam", "4", "--max-len-b", "10",
                           "--bpe", "sentencepiece", "--sentencepiece-model", str(linear_lm / "sentencepiece.bpe.model")],
                          input="return the\nthis module\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(re.findall(r"^H-\d+\t", proc.stdout, flags=re.M)) == 2, proc.stdout[-2000:]


def test_hub_sample_is_rnn_decoding(spm_data, linear_lm):
    import torch

    from fairseq_linattn.models.linear_transformer_lm import LinearTransformerLanguageModel

    data, _ = spm_data
    lm = LinearTransformerLanguageModel.from_pretrained(str(linear_lm), "checkpoint_last.pt", str(data)).eval()
    torch.manual_seed(0)
    texts = lm.sample(["return the", "this module"], beam=2, max_len_b=8)
    assert len(texts) == 2 and all(t.startswith(p) for t, p in zip(texts, ["return the", "this module"]))
    scores = lm.score("return the number of items")
    assert torch.isfinite(scores["positional_scores"]).all()


def test_favor_feature_map_trains_and_validates(spm_data, tmp_path):
    data, _ = spm_data
    log = train_lm(data, tmp_path, "--feature-map", "favor", "--favor-features", "32",
                   "--favor-redraw-interval", "2", updates=4)
    assert "FavorFeatureMap" in log
    loss = float(re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", log)[-1])
    assert 0 < loss < 20


def test_hydra_config_and_arch_override(spm_data, tmp_path):
    data, _ = spm_data
    log = run("fairseq-linattn-hydra-train", "--config-name", "language_modeling/linear_transformer_lm",
              "model=linear_transformer_lm_gpt2_tiny", f"task.data={data}", "task.tokens_per_sample=64",
              "common.fp16=false", "common.cpu=true", "common.log_format=simple", "optimization.max_update=2",
              "optimization.update_freq=[1]", "dataset.max_tokens=512", "dataset.num_workers=0",
              "model.chunk_size=32", f"checkpoint.save_dir={tmp_path / 'ckpt'}", cwd=tmp_path)
    assert "causal=True, chunk_size=32" in log
    assert re.search(r"'_name': 'linear_transformer_lm_gpt2_tiny'", log)
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def test_linear_roberta_masked_lm(mlm_data, tmp_path):
    log = run("fairseq-train", mlm_data, "--user-dir", USER_DIR, "--task", "masked_lm", "--criterion", "masked_lm",
              "--arch", "linear_roberta_base", "--encoder-layers", "2", "--encoder-embed-dim", "64",
              "--encoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4", "--max-positions", "64",
              "--tokens-per-sample", "64", "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-3",
              "--max-update", "3", "--save-dir", tmp_path, "--no-epoch-checkpoints", *COMMON)
    assert "causal=False" in log
    log = run("fairseq-validate", mlm_data, "--user-dir", USER_DIR, "--task", "masked_lm", "--criterion",
              "masked_lm", "--path", tmp_path / "checkpoint_last.pt", "--tokens-per-sample", "64", "--cpu",
              "--batch-size", "8")
    assert re.search(r"valid on 'valid' subset \| loss [0-9.]+", log)
