"""linear_transformer_lm / linear_roberta built as fairseq builds them."""
import torch

from fairseq_linattn.attention import KernelAttention

from .builders import SMALL_DECODER, SMALL_ENCODER, build


def kernel_attentions(model):
    return [m for m in model.modules() if isinstance(m, KernelAttention)]


def test_favor_layers_draw_independent_features_reproducibly():
    model, _ = build("linear_transformer_lm", feature_map="favor", favor_features=16, **SMALL_DECODER)
    again, _ = build("linear_transformer_lm", feature_map="favor", favor_features=16, **SMALL_DECODER)
    omegas = [a.feature_map.omega for a in kernel_attentions(model)]
    assert len(omegas) == 3 and all(o.shape[0] == 16 for o in omegas)
    assert not torch.equal(omegas[0], omegas[1]) and not torch.equal(omegas[1], omegas[2])
    for a, b in zip(omegas, (x.feature_map.omega for x in kernel_attentions(again))):
        assert torch.equal(a, b)  # what two distributed workers building the model would each get


def test_language_model_is_causal_without_an_n_by_n_mask():
    model, task = build("linear_transformer_lm", **SMALL_DECODER)
    model.eval()
    assert model.decoder.buffered_future_mask(torch.zeros(64, 1, 32)) is None
    attentions = kernel_attentions(model)
    assert len(attentions) == SMALL_DECODER["decoder_layers"] and all(a.causal for a in attentions)
    tokens = torch.randint(4, len(task.dictionary), (2, 30))
    changed = tokens.clone()
    changed[:, 20:] = torch.randint(4, len(task.dictionary), (2, 10))
    with torch.no_grad():
        a, _ = model(tokens)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_linear_roberta_is_bidirectional():
    model, task = build("linear_roberta_base", **SMALL_ENCODER)
    attentions = kernel_attentions(model)
    assert len(attentions) == SMALL_ENCODER["encoder_layers"] and all(not a.causal for a in attentions)
    model.eval()
    tokens = torch.randint(4, len(task.dictionary), (2, 30))
    changed = tokens.clone()
    changed[:, 20:] = torch.randint(4, len(task.dictionary), (2, 10))
    with torch.no_grad():
        a, _ = model(tokens, features_only=True)
        b, _ = model(changed, features_only=True)
    assert not torch.allclose(a[:, :20], b[:, :20])  # earlier positions see later tokens
