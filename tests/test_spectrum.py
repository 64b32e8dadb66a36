"""The attention spectrum (Linformer paper, Figure 1) on tiny models built in-process; the CLI on a checkpoint
from fairseq-train is in tests/e2e/test_warm_start.py."""
import json

import pytest
import torch
from fairseq.data import Dictionary

from fairseq_linattn.data.spm import encode_lines, train_sentencepiece
from fairseq_linattn.spectrum import (
    attention_spectrum,
    encode_text,
    normalised_cumulative_singular_values,
    split_sequences,
    write_report,
)
from tests.models.builders import SMALL_ENCODER, build

LENGTH = 32


def tiny_model(arch="roberta_base"):
    model, task = build(arch, **SMALL_ENCODER)
    with torch.no_grad():  # sharper attention than BERT's 0.02-std init, so that P is far from rank 1
        for layer in model.encoder.sentence_encoder.layers:
            layer.self_attn.q_proj.weight.mul_(40)
            layer.self_attn.k_proj.weight.mul_(40)
    return model.eval(), task


def random_sequences(count, bos=0):
    return split_sequences(torch.randint(4, 40, (count * LENGTH,)), LENGTH, count, bos)


@pytest.mark.parametrize("arch", ["roberta_base", "linformer_roberta_base", "linear_roberta_base"])
def test_curves_rise_monotonically_to_one(arch):
    model, _ = tiny_model(arch)
    spectrum = attention_spectrum(model, random_sequences(3), batch_size=2)
    assert spectrum.curves.shape == (2, 4, LENGTH) and spectrum.num_sequences == 3
    assert bool((spectrum.curves.diff(dim=-1) >= -1e-6).all())
    torch.testing.assert_close(spectrum.curves[..., -1], torch.ones(2, 4))
    assert bool((spectrum.curves[..., 0] > 0).all()) and spectrum.at(8).shape == (2, 4)
    assert float(spectrum.at(1).max()) < 0.99  # the sharpened attention is not rank 1


def test_matches_a_hand_computed_svd_of_one_head():
    model, _ = tiny_model()
    tokens = random_sequences(1)
    layer, head = 1, 2
    _, extra = model.encoder.extract_features(tokens, return_all_hiddens=True)
    x = extra["inner_states"][layer][:, 0].double()  # the layer's input (post-norm RoBERTa): T x C
    attn = model.encoder.sentence_encoder.layers[layer].self_attn
    d = attn.head_dim
    rows = slice(head * d, (head + 1) * d)
    q = x @ attn.q_proj.weight[rows].double().t() + attn.q_proj.bias[rows].double()
    k = x @ attn.k_proj.weight[rows].double().t() + attn.k_proj.bias[rows].double()
    p = torch.softmax(q @ k.t() / d**0.5, dim=-1)
    sigma = torch.linalg.svd(p).S
    expected = sigma.cumsum(0) / sigma.sum()
    spectrum = attention_spectrum(model, tokens)
    torch.testing.assert_close(spectrum.curves[layer, head].double(), expected, rtol=1e-4, atol=1e-4)


def test_normalised_cumulative_singular_values_of_known_matrices():
    identity, rank_one = torch.eye(4), torch.full((4, 4), 0.25)
    curves = normalised_cumulative_singular_values(torch.stack([identity, rank_one]))
    torch.testing.assert_close(curves, torch.tensor([[0.25, 0.5, 0.75, 1.0], [1.0, 1.0, 1.0, 1.0]]))


def test_text_is_encoded_like_fairseq_binarizes_it(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("open the file and read it .\n\nclose the file .\n" * 20)
    dictionary = Dictionary()
    for word in "open the file and read it . close".split():
        dictionary.add_symbol(word)
    stream = encode_text(text, dictionary)
    assert stream[:8].tolist() == [dictionary.index(w) for w in "open the file and read it .".split()] + [2]
    assert stream.numel() == 20 * (8 + 5)  # empty lines skipped, </s> after each line
    sequences = split_sequences(stream, 16, count=100, bos=dictionary.bos())
    assert sequences.shape == (stream.numel() // 15, 16) and bool((sequences[:, 0] == 0).all())
    with pytest.raises(ValueError, match="smaller --length"):
        split_sequences(stream[:10], 16, count=1, bos=0)


def test_sentencepiece_text_and_the_unknown_token_check(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("".join(f"the function number {i} returns a list of items .\n" for i in range(200)))
    model = train_sentencepiece([text], tmp_path / "spm", vocab_size=60, hard_vocab_limit=False, num_threads=1)
    dictionary = Dictionary()
    for line in encode_lines(model, text.read_text().splitlines()):
        for piece in line.split():
            dictionary.add_symbol(piece)
    stream = encode_text(text, dictionary, sentencepiece_model=model)
    assert not bool(stream.eq(dictionary.unk()).any())
    with pytest.raises(ValueError, match="--sentencepiece-model"):
        encode_text(text, dictionary)  # raw words against a dictionary of pieces: mostly <unk>


def test_report_files(tmp_path):
    model, _ = tiny_model()
    spectrum = attention_spectrum(model, random_sequences(2))
    paths = write_report(spectrum, 8, tmp_path, "model.pt", "roberta_base")
    summary = json.loads(paths["json"].read_text())
    assert summary["index"] == 8 and summary["num_sequences"] == 2
    torch.testing.assert_close(torch.tensor(summary["at_index"]), spectrum.at(8), atol=1e-5, rtol=0)
    assert len(summary["layer_mean_curves"]) == 2 and len(summary["layer_mean_curves"][0]) == LENGTH
    assert paths["png"].stat().st_size > 10_000
    assert paths["md"].read_text().count("\n| ") == 3  # header + one row per layer
    with pytest.raises(ValueError, match="--index must be in"):
        spectrum.at(LENGTH + 1)
