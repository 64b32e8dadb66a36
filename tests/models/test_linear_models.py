"""linear_transformer_lm / linear_roberta built as fairseq builds them."""
from argparse import Namespace

import torch
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.models import transformer_lm as fairseq_lm

from fairseq_linattn.attention import KernelAttention
from fairseq_linattn.attention.causal_softmax import CausalSoftmaxAttention
from fairseq_linattn.attention.mechanisms.gated_delta import GatedDeltaNetAttention
from fairseq_linattn.models.linear_transformer_lm import HYBRID, LinearTransformerLanguageModel

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


def test_softmax_mechanism_bare_is_transformer_lm():
    """``--linear-attention softmax --short-conv 0 --output-gate 0``: transformer_lm's parameters under the same names
    (its state dict loads as it is) and its outputs, in the forward and token by token with the key/value cache."""
    ours, task = build("linear_transformer_lm", linear_attention="softmax", short_conv=0, output_gate=0,
                       **SMALL_DECODER)
    theirs, _ = build("transformer_lm", task, **SMALL_DECODER)
    ours.load_state_dict(theirs.state_dict())
    ours.eval(), theirs.eval()
    tokens = torch.randint(4, len(task.dictionary), (2, 12))
    with torch.no_grad():
        expected = theirs(tokens)[0]
        torch.testing.assert_close(ours(tokens)[0], expected, rtol=1e-5, atol=1e-5)
        state = {}
        steps = [ours.decoder(tokens[:, :t + 1], incremental_state=state)[0] for t in range(tokens.size(1))]
        torch.testing.assert_close(torch.cat(steps, 1), expected, rtol=1e-5, atol=1e-5)


def test_a_layout_gives_each_layer_its_mechanism_and_decodes_as_the_forward():
    """``--linear-attention gated-delta,softmax`` (repeated to the depth): a recurrent state in layers 0 and 2, a
    key/value cache in layer 1; token-by-token decoding (each layer with its own cache or state), beams reordered
    midway, equals the parallel forward; the layout is the checkpoint's identity."""
    model, task = build("linear_transformer_lm", linear_attention="gated-delta,softmax", **SMALL_DECODER)
    model.eval()
    kinds = [type(layer.self_attn) for layer in model.decoder.layers]
    assert kinds == [GatedDeltaNetAttention, CausalSoftmaxAttention, GatedDeltaNetAttention]
    identity = LinearTransformerLanguageModel.identity(Namespace(linear_attention="gated-delta,softmax"))
    assert identity["--linear-attention"] == "gated-delta,softmax"
    tokens = torch.randint(4, len(task.dictionary), (3, 14))
    order = torch.tensor([2, 0, 1])
    with torch.no_grad():
        state, steps = {}, []
        for t in range(tokens.size(1)):
            if t == 7:  # beam search's reorder: every layer's cache or state follows
                model.decoder.reorder_incremental_state_scripting(state, order)
                tokens, steps = tokens[order], [s[order] for s in steps]
            steps.append(model.decoder(tokens[:, :t + 1], incremental_state=state)[0])
        expected = model(tokens)[0]
    torch.testing.assert_close(torch.cat(steps, 1), expected, rtol=1e-5, atol=1e-5)


def test_the_hybrid_archs_are_three_gated_delta_layers_to_one_softmax():
    """linear_transformer_lm_hybrid (and _hybrid_<size>): transformer_lm's sizes with the 3:1 layout, unless the
    command line names another."""
    sizes = (("", fairseq_lm.base_lm_architecture), ("_gpt2_small", fairseq_lm.transformer_lm_gpt2_small))
    for size, fairseq_size in sizes:
        args, theirs = Namespace(), Namespace()
        ARCH_CONFIG_REGISTRY[f"linear_transformer_lm_hybrid{size}"](args)
        fairseq_size(theirs)
        assert args.linear_attention == HYBRID and args.decoder_layers == theirs.decoder_layers
    chosen = Namespace(linear_attention="gla,softmax")
    ARCH_CONFIG_REGISTRY["linear_transformer_lm_hybrid"](chosen)
    assert chosen.linear_attention == "gla,softmax"
    model, _ = build("linear_transformer_lm", linear_attention=HYBRID, **{**SMALL_DECODER, "decoder_layers": 8})
    softmax = [isinstance(layer.self_attn, CausalSoftmaxAttention) for layer in model.decoder.layers]
    assert softmax == [False, False, False, True] * 2
