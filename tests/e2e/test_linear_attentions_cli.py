"""--linear-attention <mechanism> (each registered one, softmax, and kernel attention given the convolution and gate
that it has only when asked) through the real command lines: fairseq-train,
fairseq-eval-lm with a context window, fairseq-generate with beam search (the recurrent step and beam
reorder), the hub's sample(), and a checkpoint refusing another mechanism."""
import re

import pytest

from fairseq_linattn.attention import KernelAttention
from fairseq_linattn.attention.causal_softmax import CausalSoftmaxAttention
from fairseq_linattn.attention.recurrent_state import linear_attentions

from .cli import USER_DIR, run, train_lm, valid_loss

CLASSES = {"softmax": CausalSoftmaxAttention, "kernel": KernelAttention, **linear_attentions()}
MECHANISMS = sorted(CLASSES)
EXTRA = {"kernel": ["--short-conv", "4", "--output-gate", "1"]}  # the others have both by default


@pytest.fixture(scope="module", params=MECHANISMS)
def trained(request, spm_data, tmp_path_factory):
    data, _ = spm_data
    save = tmp_path_factory.mktemp(request.param)
    log = train_lm(data, save, "--linear-attention", request.param, *EXTRA.get(request.param, []), "--chunk-size", "16",
                   updates=8)
    return request.param, save, log


def test_trains_validates_evaluates_and_generates(spm_data, trained):
    data, _ = spm_data
    name, save, log = trained
    assert f"{CLASSES[name].__name__}(" in log and "ShortConvolution(" in log and "gate_proj" in log
    assert 0 < valid_loss(log) < 20
    ppl = {}
    for window in ("0", "32"):
        log = run("fairseq-eval-lm", data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt", "--cpu",
                  "--gen-subset", "test", "--tokens-per-sample", "64", "--context-window", window, "--batch-size", "4")
        ppl[window] = float(re.findall(r"Perplexity: ([0-9.]+)", log)[-1])
    assert all(1 < p < 10_000 for p in ppl.values()) and ppl["0"] != ppl["32"]
    log = run("fairseq-generate", data, "--user-dir", USER_DIR, "--task", "language_modeling", "--path",
              save / "checkpoint_last.pt", "--cpu", "--beam", "4", "--nbest", "2", "--max-len-b", "12",
              "--prefix-size", "2", "--gen-subset", "test", "--sample-break-mode", "eos", "--tokens-per-sample", "64",
              "--skip-invalid-size-inputs-valid-test", "--max-sentences", "4", "--max-tokens", "400")
    hypotheses = re.findall(r"^H-(\d+)\t(-?[0-9.]+)\t(.*)$", log, flags=re.M)
    assert len(hypotheses) >= 8, log[-2000:]
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", log, flags=re.M))
    assert all(text.split()[:2] == sources[i].split()[:2] for i, _, text in hypotheses)


@pytest.mark.parametrize("trained", ["gated-delta"], indirect=True)  # once: the mechanism with every piece
def test_hub_sample_and_score(spm_data, trained):
    import shutil

    import torch

    from fairseq_linattn.models.linear_transformer_lm import LinearTransformerLanguageModel

    data, spm_model = spm_data
    name, save, _ = trained
    shutil.copy(spm_model, save / "sentencepiece.bpe.model")
    lm = LinearTransformerLanguageModel.from_pretrained(str(save), "checkpoint_last.pt", str(data)).eval()
    torch.manual_seed(0)
    texts = lm.sample(["return the", "this module"], beam=2, max_len_b=8)
    assert len(texts) == 2 and all(t.startswith(p) for t, p in zip(texts, ["return the", "this module"]))
    assert torch.isfinite(lm.score("return the number of items")["positional_scores"]).all()


def test_a_checkpoint_refuses_another_mechanism(spm_data, trained, tmp_path):
    """gla and retention differ by a small gate only; gated-delta and delta by a few vectors (gdn2 is tried as
    gated-delta, its special case): a resumed run under the other name must stop and say so, not load what fits."""
    data, _ = spm_data
    name, save, _ = trained
    other = {"retention": "gla", "gla": "retention", "delta": "gated-delta", "gated-delta": "delta",
             "gdn2": "gated-delta", "kda": "gdn2", "softmax": "retention", "kernel": "retention"}[name]
    log = train_lm(data, tmp_path, "--linear-attention", other, "--chunk-size", "16", "--restore-file",
                   save / "checkpoint_last.pt", "--reset-optimizer", updates=9, check=False)
    assert log.returncode != 0 and "--linear-attention" in log, log[-2000:]


def test_arch_and_hydra_config_name_the_mechanism(spm_data, tmp_path):
    """``--arch linear_transformer_lm_gated_delta`` and, under fairseq-linattn-hydra-train, the language-model
    config with ``model.linear_attention`` overridden."""
    data, _ = spm_data
    log = train_lm(data, tmp_path / "arch", arch="linear_transformer_lm_gated_delta", updates=2)
    assert "GatedDeltaNetAttention(" in log
    log = run("fairseq-linattn-hydra-train", "--config-name", "language_modeling/linear_transformer_lm",
              "model=linear_transformer_lm_gpt2_tiny", f"task.data={data}", "task.tokens_per_sample=64",
              "common.fp16=false", "common.cpu=true", "common.log_format=simple", "optimization.max_update=2",
              "optimization.update_freq=[1]", "dataset.max_tokens=512", "dataset.num_workers=0",
              "model.linear_attention=gla", "model.short_conv=0", f"checkpoint.save_dir={tmp_path / 'ckpt'}",
              cwd=tmp_path)
    assert "GatedLinearAttention(" in log and "ShortConvolution(" not in log
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def test_a_carried_training_state_through_fairseq_train(spm_data, tmp_path):
    """--train-state carried under the real trainer: fairseq's set_num_updates promotes the states between updates
    (two micro-batches per update here), validation starts from zero, the checkpoint loads for evaluation."""
    data, _ = spm_data
    log = train_lm(data, tmp_path, "--linear-attention", "gated-delta", "--train-state", "carried", "--chunk-size",
                   "16", "--update-freq", "2", updates=4)
    assert "train_state=carried" in log and 0 < valid_loss(log) < 20
    log = run("fairseq-eval-lm", data, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt", "--cpu",
              "--gen-subset", "test", "--tokens-per-sample", "64", "--batch-size", "4")
    assert 1 < float(re.findall(r"Perplexity: ([0-9.]+)", log)[-1]) < 10_000


def test_a_hybrid_layout_through_the_command_lines(spm_data, tmp_path):
    """--arch linear_transformer_lm_hybrid's layout, small, with a sliding-window softmax layer: fairseq-train,
    fairseq-eval-lm with a context window (a key/value cache in the softmax layer, states in the others) and
    fairseq-generate with beam search."""
    data, _ = spm_data
    log = train_lm(data, tmp_path, "--linear-attention", "gated-delta,gated-delta,softmax", "--chunk-size", "16",
                   "--decoder-layers", "3", "--softmax-window", "16", updates=4)
    # torch prints the two identical gated-delta layers once, as "(0-1): 2 x"
    assert "(0-1): 2 x" in log and "GatedDeltaNetAttention(" in log and "CausalSoftmaxAttention(" in log, log[-3000:]
    assert "window=16" in log  # the softmax layer's sliding window (64-token samples: trained block by block)
    log = run("fairseq-eval-lm", data, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt", "--cpu",
              "--gen-subset", "test", "--tokens-per-sample", "64", "--context-window", "32", "--batch-size", "4")
    assert 1 < float(re.findall(r"Perplexity: ([0-9.]+)", log)[-1]) < 10_000
    log = run("fairseq-generate", data, "--user-dir", USER_DIR, "--task", "language_modeling", "--path",
              tmp_path / "checkpoint_last.pt", "--cpu", "--beam", "4", "--max-len-b", "12", "--prefix-size", "2",
              "--gen-subset", "test", "--sample-break-mode", "eos", "--tokens-per-sample", "64",
              "--skip-invalid-size-inputs-valid-test", "--max-sentences", "4", "--max-tokens", "400")
    assert len(re.findall(r"^H-\d+\t", log, flags=re.M)) >= 4, log[-2000:]


def test_attention_transfer_then_a_finetune(spm_data, tmp_path):
    """Attention transfer through fairseq-train (--criterion attention_transfer: the hedgehog maps learn to mimic
    softmax over the model's own projections, the task's loss logged beside), then the usual criterion from there."""
    data, _ = spm_data
    log = train_lm(data, tmp_path / "transfer", "--feature-map", "hedgehog", "--criterion", "attention_transfer",
                   updates=6)
    losses = [float(x) for x in re.findall(r"\| loss ([0-9.]+) \| task_loss", log)]
    assert losses and "task_loss" in log, log[-3000:]
    log = train_lm(data, tmp_path / "finetune", "--feature-map", "hedgehog", "--restore-file",
                   tmp_path / "transfer" / "checkpoint_last.pt", "--reset-optimizer", "--reset-dataloader",
                   "--reset-meters", updates=2)
    assert 0 < valid_loss(log) < 20
