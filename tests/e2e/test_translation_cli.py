"""linear_transformer through the real command lines: the catalog data script, fairseq-train --task translation,
fairseq-generate (beam 5, sacrebleu and chrF scoring), fairseq-interactive (a source too long is skipped), the
hub's translate(), hydra."""
import re

import pytest

from fairseq_linattn.models.linear_transformer import LinearTransformerModel

from ..data.mo_files import numbered_catalogs
from .cli import COMMON, ROOT, USER_DIR, python, run

SPM = "sentencepiece.bpe.model"
TRAIN = ["--task", "translation", "--arch", "linear_transformer_tiny", "--share-all-embeddings", "--optimizer", "adam",
         "--lr", "2e-3", "--max-tokens", "1024", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing",
         "0.1", "--no-epoch-checkpoints", *COMMON]


@pytest.fixture(scope="module")
def catalog_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("catalogs")
    locale = numbered_catalogs(root / "locale", catalogs=20, per_catalog=40)
    log = python(f"{ROOT}/scripts/prepare_translation_data.py", "--destdir", root / "data-bin", "--locale-dir", locale,
                 "--vocab-size", "120", "--min-pairs", "500")
    assert re.search(r"test \d+ pairs, valid \d+ pairs, train \d+ pairs", log), log
    for name in ("dict.en.txt", "dict.de.txt", "train.en-de.en.bin", "test.en-de.de.idx", SPM, "raw/test.de"):
        assert (root / "data-bin" / name).exists(), name
    assert (root / "data-bin" / "dict.en.txt").read_text() == (root / "data-bin" / "dict.de.txt").read_text()
    return root / "data-bin"


@pytest.fixture(scope="module")
def linear_mt(catalog_data, tmp_path_factory):
    save = tmp_path_factory.mktemp("linear_mt")
    log = run("fairseq-train", catalog_data, "--user-dir", USER_DIR, *TRAIN, "--max-update", "8", "--save-dir", save)
    # the defaults: fairseq's encoder layer, a gated-delta decoder, softmax over the source (fairseq's attention, its
    # cache one row per sentence in beam search: SharedSourceAttention)
    assert "(self_attn): GatedDeltaNetAttention(" in log and "(encoder_attn): SharedSourceAttention(" in log, log[-4000:]
    assert "KernelAttention" not in log and "KernelCrossAttention" not in log
    (save / SPM).write_bytes((catalog_data / SPM).read_bytes())  # the hub looks for it beside the checkpoint
    return save


BPE_WARNING = "the BLEU score is computed on BPE tokens, not on proper words"


@pytest.mark.parametrize("scoring, metric", [("sacrebleu", "BLEU"), ("chrf", "chrF"), ("bleu", "BLEU4")])
def test_generate_with_beam_search_and_scores(catalog_data, linear_mt, scoring, metric):
    log = run("fairseq-generate", catalog_data, "--user-dir", USER_DIR, "--path", linear_mt / "checkpoint_last.pt",
              "--gen-subset", "test", "--beam", "5", "--nbest", "2", "--batch-size", "16", "--cpu",
              # fairseq 0.12 drops the sentences of a last batch beyond a multiple of 8 (its default) with --batch-size
              "--required-batch-size-multiple", "1", "--bpe", "sentencepiece", "--sentencepiece-model",
              catalog_data / SPM, "--scoring", scoring, "--max-len-b", "20")
    assert re.search(rf"Generate test with beam=5: {metric}", log), log[-3000:]
    hypotheses = re.findall(r"^D-\d+\t", log, re.M)
    assert len(hypotheses) == 2 * len((catalog_data / "raw" / "test.de").read_text().splitlines())
    # sacrebleu and chrF score the decoded text (T- and D- lines): fairseq's warning is wrong there and dropped;
    # its own bleu scores the pieces' ids, and keeps it
    assert (BPE_WARNING in log) == (scoring == "bleu"), log[-3000:]
    assert re.search(r"^T-\d+\t\S+ \S+", log, re.M)  # references with spaces between their words


def test_post_process_with_bpe_sentencepiece_is_refused(catalog_data, linear_mt):
    """Both decode the pieces: decoded twice, references and hypotheses lost their spaces ("Zweig%skannnicht...")
    and were scored that way, without a word."""
    log = run("fairseq-generate", catalog_data, "--user-dir", USER_DIR, "--path", linear_mt / "checkpoint_last.pt",
              "--gen-subset", "test", "--cpu", "--bpe", "sentencepiece", "--sentencepiece-model", catalog_data / SPM,
              "--post-process", "sentencepiece", "--scoring", "sacrebleu", check=False, subprocess=True)
    last = log.strip().splitlines()[-1]
    assert log.returncode == 2 and "Traceback" not in log, log[-3000:]
    assert last == ("fairseq-generate: error: --post-process sentencepiece and --bpe sentencepiece both decode the "
                    "pieces, and decoded twice the words lose their spaces: pass only --bpe sentencepiece (with its "
                    "--sentencepiece-model)")


def test_interactive(catalog_data, linear_mt):
    log = run("fairseq-interactive", catalog_data, "--user-dir", USER_DIR, "--path", linear_mt / "checkpoint_last.pt",
              "--beam", "5", "--cpu", "--bpe", "sentencepiece", "--sentencepiece-model", catalog_data / SPM,
              "--source-lang", "en", "--target-lang", "de", "--input", catalog_data / "raw" / "valid.en")
    assert len(re.findall(r"^H-\d+\t", log, re.M)) == len((catalog_data / "raw" / "valid.en").read_text().splitlines())


def test_interactive_skips_a_source_too_long_and_reads_on(catalog_data, linear_mt):
    """A source longer than the 1,024 positions ended the session ('Size of sample #0 is invalid'); now one warning
    naming the options, and the next line is translated. With them, the line is translated."""
    long_line = " ".join(["cannot open file"] * 90)  # 1,081 tokens with </s>
    interactive = ["fairseq-interactive", catalog_data, "--user-dir", USER_DIR, "--path",
                   linear_mt / "checkpoint_last.pt", "--beam", "2", "--cpu", "--bpe", "sentencepiece",
                   "--sentencepiece-model", catalog_data / SPM, "--source-lang", "en", "--target-lang", "de"]
    log = run(*interactive, input=f"cannot open file\n{long_line}\nshared message\n")
    assert re.findall(r"^H-(\d+)\t", log, re.M) == ["0", "2"] and "Traceback" not in log, log[-3000:]
    (skipped,) = [line for line in log.splitlines() if "skipped" in line]
    options = '''--max-source-positions 2048 --model-overrides "{'max_source_positions': 2048}"'''
    assert "line 2 skipped: 1081 tokens, more than the 1024 positions allowed" in skipped
    assert skipped.endswith(options)
    log = run(*interactive, "--max-source-positions", "2048", "--model-overrides", "{'max_source_positions': 2048}",
              input=f"{long_line}\n")
    assert re.findall(r"^H-(\d+)\t", log, re.M) == ["0"] and "skipped" not in log, log[-3000:]


def test_hub_translate_is_rnn_decoding(catalog_data, linear_mt):
    hub = LinearTransformerModel.from_pretrained(str(linear_mt), "checkpoint_last.pt", str(catalog_data)).eval()
    out = hub.translate(["cannot open file %s (1.2)", "shared message"], beam=5)
    assert len(out) == 2 and all(isinstance(text, str) for text in out)
    assert hub.translate("cannot open file %s (1.2)", beam=5) == out[0]  # batched == alone


def test_kernel_attention_in_every_role(catalog_data, tmp_path):
    """The layout before 0.3 (and the fastest decoding): kernel attention in the encoder, the decoder and over the
    source, here with FAVOR+ features."""
    log = run("fairseq-train", catalog_data, "--user-dir", USER_DIR, *TRAIN, "--max-update", "2", "--save-dir",
              tmp_path, "--encoder-attention", "kernel", "--linear-attention", "kernel", "--cross-attention", "kernel",
              "--feature-map", "favor")
    assert "(encoder_attn): KernelCrossAttention(" in log and "causal=True, chunk_size=64" in log, log[-4000:]
    assert "GatedDeltaNetAttention" not in log and "(encoder_attn): SharedSourceAttention(" not in log
    run("fairseq-generate", catalog_data, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
        "--gen-subset", "valid", "--beam", "5", "--batch-size", "16", "--cpu", "--max-len-b", "10")


def test_softmax_encoder_and_a_gated_delta_decoder(catalog_data, tmp_path):
    """Attention per role through the command lines: fairseq's encoder layer, gated-delta decoding as an RNN with
    beam search, kernel attention over the source."""
    log = run("fairseq-train", catalog_data, "--user-dir", USER_DIR, *TRAIN, "--max-update", "2", "--save-dir",
              tmp_path, "--encoder-attention", "softmax", "--linear-attention", "gated-delta", "--cross-attention",
              "kernel")
    assert "(self_attn): GatedDeltaNetAttention(" in log and "KernelCrossAttention" in log, log[-3000:]
    out = run("fairseq-generate", catalog_data, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
              "--gen-subset", "valid", "--beam", "5", "--batch-size", "16", "--cpu", "--max-len-b", "10")
    assert "BLEU" in out


def test_bad_cross_attention_is_refused_at_start_up(catalog_data, tmp_path):
    log = run("fairseq-train", catalog_data, "--user-dir", USER_DIR, *TRAIN, "--max-update", "1", "--save-dir",
              tmp_path, "--cross-attention", "linformer", check=False)
    assert log.returncode == 2 and "--cross-attention: invalid choice: 'linformer'" in log


def test_hydra_config(catalog_data, tmp_path):
    log = run("fairseq-linattn-hydra-train", "--config-name", "translation/linear_transformer_iwslt_de_en",
              "model=linear_transformer_tiny", f"task.data={catalog_data}", "common.cpu=true",
              "common.log_format=simple", "optimization.max_update=2", "dataset.max_tokens=1024",
              "dataset.num_workers=0", "model.feature_map=relu", "model.cross_attention=kernel",
              f"checkpoint.save_dir={tmp_path / 'ckpt'}", cwd=tmp_path)
    assert "(encoder_attn): KernelCrossAttention(" in log and "relu: 32 -> 32" in log, log[-4000:]
    assert "(self_attn): GatedDeltaNetAttention(" in log  # the config's decoder
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def test_a_trained_transformer_converts(catalog_data, tmp_path):
    """fairseq-linattn-warm-start from fairseq's own transformer: softmax in every role (and no convolution or gate)
    is the parent exactly (fairseq-generate's scores); hedgehog kernel attention prints the flags that rebuild it,
    with which the attention transfer restarts from the conversion."""
    parent = tmp_path / "parent"
    run("fairseq-train", catalog_data, "--user-dir", USER_DIR, *TRAIN, "--arch", "transformer_tiny", "--max-update", "4",
        "--save-dir", parent)

    def scores(path):
        log = run("fairseq-generate", catalog_data, "--user-dir", USER_DIR, "--path", path, "--gen-subset", "test",
                  "--beam", "2", "--batch-size", "16", "--cpu", "--max-len-b", "10")
        return sorted(re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", log, re.M))

    softmax = ["--encoder-attention", "softmax", "--cross-attention", "softmax", "--linear-attention", "softmax",
               "--short-conv", "0", "--output-gate", "0"]
    log = run("fairseq-linattn-warm-start", parent / "checkpoint_last.pt", tmp_path / "softmax.pt", "--data",
              catalog_data, *softmax)
    assert "new: none" in log and "top-1 agreement of the output heads 100.0%" in log, log[-2000:]
    ours, theirs = scores(tmp_path / "softmax.pt"), scores(parent / "checkpoint_last.pt")
    assert [(i, text) for i, _, text in ours] == [(i, text) for i, _, text in theirs] and ours
    assert all(abs(float(a[1]) - float(b[1])) < 1e-5 for a, b in zip(ours, theirs))  # fp32 rounding
    log = run("fairseq-linattn-warm-start", parent / "checkpoint_last.pt", tmp_path / "hedgehog.pt", "--data",
              catalog_data, "--encoder-attention", "kernel", "--linear-attention", "kernel", "--cross-attention",
              "kernel", "--feature-map", "hedgehog")
    flags = re.search(r"(--arch .*) --restore-file", log).group(1).split()
    assert flags[:2] == ["--arch", "linear_transformer_tiny"] and "--share-all-embeddings" in flags, flags
    criterion = TRAIN.index("--criterion")  # the transfer's own, instead of label smoothing
    log = run("fairseq-train", catalog_data, "--user-dir", USER_DIR, *TRAIN[:criterion], *TRAIN[criterion + 4:], *flags,
              "--criterion", "attention_transfer",
              "--restore-file", tmp_path / "hedgehog.pt", "--reset-optimizer", "--reset-dataloader", "--reset-meters",
              "--max-update", "2", "--save-dir", tmp_path / "transfer")
    assert "task_loss" in log
