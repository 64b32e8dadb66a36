"""linear_transformer_lm and linear_roberta through the real command lines: train, eval-lm (with a context
window), generate with beam search, interactive (lines too long, bytes that are not UTF-8, lengths above the
model's positions), hydra, the hub's sample() (2,000 tokens as an RNN from a model trained on 64)."""
import logging
import re
import shutil

import pytest

from fairseq_linattn.compat import generation

from .cli import COMMON, USER_DIR, run, train_lm

LONG_LINE = " ".join(["return the number of items in a container"] * 12)  # 157 tokens: the model has 64 positions


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


def interactive(data, model, *args, lines, **options):
    return run("fairseq-interactive", data, "--user-dir", USER_DIR, "--task", "language_modeling", "--path",
               model / "checkpoint_last.pt", "--cpu", "--beam", "2", "--bpe", "sentencepiece", "--sentencepiece-model",
               model / "sentencepiece.bpe.model", *args, input=lines, **options)


def hypotheses(log):
    return [int(n) for n in re.findall(r"^H-(\d+)\t", log, flags=re.M)]


@pytest.mark.parametrize("flag", [[], ["--skip-invalid-size-inputs-valid-test"]], ids=["default", "skip-flag"])
def test_interactive_skips_a_line_too_long_for_the_model_and_reads_on(spm_data, linear_lm, flag):
    """A prompt longer than the model's 64 positions ended the session: 'Size of sample #0 is invalid', and with
    the flag NothingToEvaluateError. Now one warning naming the override, and the next line is read; a length
    above the positions is one warning for the whole session."""
    log = interactive(spm_data[0], linear_lm, "--max-len-b", "100", *flag,
                      lines=f"return the\n{LONG_LINE}\nthis module\n")
    assert hypotheses(log) == [0, 2] and "Traceback" not in log, log[-3000:]
    (skipped,) = [line for line in log.splitlines() if "skipped" in line]
    assert "line 2 skipped: 157 tokens, more than the 64 positions allowed" in skipped
    assert skipped.endswith('''--model-overrides "{'max_target_positions': 256}"''')
    (capped,) = [line for line in log.splitlines() if "generating at most" in line]
    assert "at most 63 tokens, not the 100 asked for" in capped
    assert capped.endswith('''--model-overrides "{'max_target_positions': 101}"''')


def test_interactive_reads_the_long_line_with_the_override_the_warning_names(spm_data, linear_lm):
    log = interactive(spm_data[0], linear_lm, "--max-len-a", "1", "--max-len-b", "4", "--model-overrides",
                      "{'max_target_positions': 256}", lines=f"return the\n{LONG_LINE}\n")
    assert hypotheses(log) == [0, 1] and "skipped" not in log and "generating at most" not in log, log[-3000:]
    prompt = re.search(r"^S-1\t(.*)$", log, flags=re.M).group(1).split()
    continued = re.search(r"^H-1\t\S+\t(.*)$", log, flags=re.M).group(1).split()
    assert len(prompt) == 156 and continued[:156] == prompt  # the whole line was read, and continued


def test_interactive_min_len_above_the_models_positions_is_one_line(spm_data, linear_lm):
    """fairseq asserted 'min_len cannot be larger than max_len' with a traceback."""
    log = interactive(spm_data[0], linear_lm, "--min-len", "100", lines="return the\n", check=False)
    last = log.strip().splitlines()[-1]
    assert log.returncode == 2 and "Traceback" not in log, log[-3000:]
    assert last.startswith("fairseq-interactive: error: min_len=100 asks for more than the 63 tokens")
    assert last.endswith('''--model-overrides "{'max_target_positions': 101}"''')


def test_interactive_reads_on_after_bytes_that_are_not_utf8(spm_data, linear_lm):
    """sentencepiece failed on the surrogate-escaped line ('Unable to cast Python instance of type <class 'str'>'):
    a real start, reading its real stdin."""
    log = interactive(spm_data[0], linear_lm, "--max-len-b", "8", lines=b"return the\ncaf\xe9 \xff module\nthis module\n",
                      subprocess=True)
    assert hypotheses(log) == [0, 1, 2] and "Traceback" not in log, log[-3000:]
    (warning,) = [line for line in log.splitlines() if "not UTF-8" in line]
    assert "line 2 is not UTF-8 (invalid continuation byte at byte 4): read with U+FFFD" in warning
    assert re.search(r"^S-1\t.*module$", log, flags=re.M)  # the rest of the line is read


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


def test_hub_says_when_fairseq_caps_the_length(spm_data, linear_lm, caplog):
    """sample(max_len_b=2000) stopped silently at 63 tokens, and min_len=500 failed with fairseq's assertion."""
    from fairseq_linattn.models.linear_transformer_lm import LinearTransformerLanguageModel

    lm = LinearTransformerLanguageModel.from_pretrained(str(linear_lm), "checkpoint_last.pt", str(spm_data[0])).eval()
    with caplog.at_level(logging.WARNING, logger=generation.__name__):
        (hypothesis,) = lm.generate(lm.encode("return the"), beam=1, max_len_b=2000)
    assert len(hypothesis["tokens"]) <= 64
    (warning,) = [r.getMessage() for r in caplog.records if r.name == generation.__name__]
    assert "at most 63 tokens, not the 2000 asked for" in warning
    assert "from_pretrained(..., max_target_positions=2001)" in warning
    with pytest.raises(ValueError, match=r"min_len=500 .* from_pretrained\(\.\.\., max_target_positions=501\)"):
        lm.generate(lm.encode("return the"), beam=1, max_len_b=2000, min_len=500)


def test_hub_samples_2000_tokens_as_an_rnn_in_constant_memory(spm_data, linear_lm, caplog):
    """A model trained on 64-token samples, loaded with 2,048 positions, samples 2,000 tokens decoding one token
    at a time; its incremental state (every layer's) has the same size at step 100 as at step 2,000."""
    import torch

    from fairseq_linattn.models.linear_transformer_lm import LinearTransformerLanguageModel

    lm = LinearTransformerLanguageModel.from_pretrained(str(linear_lm), "checkpoint_last.pt", str(spm_data[0]),
                                                        max_target_positions=2048).eval()
    decoder, state_bytes = lm.models[0].decoder, {}
    forward = decoder.forward

    def recording(tokens, *args, incremental_state=None, **kwargs):
        out = forward(tokens, *args, incremental_state=incremental_state, **kwargs)
        assert incremental_state is not None and out[0].size(1) == 1  # one new token per step: RNN decoding
        state_bytes[tokens.size(1)] = sum(t.numel() * t.element_size() for layer in incremental_state.values()
                                          for t in layer.values() if t is not None)
        return out

    decoder.forward = recording
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger=generation.__name__):
        (hypothesis,) = lm.generate(lm.encode("return the"), beam=1, sampling=True, sampling_topk=10,
                                    max_len_b=2000, min_len=2000)
    assert len(hypothesis["tokens"]) == 2001  # 2,000 tokens and </s>
    assert not [r for r in caplog.records if r.name == generation.__name__]  # nothing capped
    assert 0 < state_bytes[100] == state_bytes[2000], (state_bytes[100], state_bytes[2000])


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
