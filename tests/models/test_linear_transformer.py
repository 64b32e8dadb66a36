"""linear_transformer (translation): kernel encoder-decoder attention against its reference, and the decoder's
incremental (RNN) form against its parallel forward, with beam reordering and fairseq's own beam search."""
import copy

import pytest
import torch
from fairseq.modules import MultiheadAttention
from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

from fairseq_linattn.attention import KernelAttention, KernelCrossAttention
from fairseq_linattn.attention.causal_softmax import CausalSoftmaxAttention
from fairseq_linattn.attention.feature_maps import FEATURE_MAPS
from fairseq_linattn.attention.ops.linear_attn import linear_attention_reference
from fairseq_linattn.attention.ops.linear_attn.bidirectional import attend_to_summary, summarise
from fairseq_linattn.attention.recurrent_state import linear_attentions
from fairseq_linattn.models.decoding import SharedSourceAttention

from .builders import build

SMALL = dict(encoder_layers=2, decoder_layers=2, encoder_embed_dim=32, decoder_embed_dim=32,
             encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_attention_heads=4,
             decoder_attention_heads=4, dropout=0.0, max_source_positions=128, max_target_positions=128)


# kernel attention in every role (the defaults before 0.3): what this module's kernel-attention tests build unless
# a role is named
ALL_KERNEL = dict(encoder_attention="kernel", linear_attention="kernel", cross_attention="kernel")


def translation_model(defaults=ALL_KERNEL, **overrides):
    torch.manual_seed(0)
    model, task = build("linear_transformer", **{**SMALL, **defaults, **overrides})
    return model.eval(), task


def test_the_defaults_are_the_configuration_closest_to_softmax():
    """results/translation_1500*: a softmax encoder, a gated-delta decoder and softmax cross-attention."""
    from fairseq_linattn.attention.mechanisms.gated_delta import GatedDeltaNetAttention

    model, _ = translation_model(defaults={})
    assert all(type(layer.self_attn) is MultiheadAttention for layer in model.encoder.layers)
    assert all(type(layer.self_attn) is GatedDeltaNetAttention for layer in model.decoder.layers)
    assert all(type(layer.encoder_attn) is SharedSourceAttention for layer in model.decoder.layers)  # fairseq's


def source_batch(task, lengths=(9, 6, 3)):
    """Left-padded sources (fairseq's translation default) ending in </s>."""
    pad, eos, n = task.dictionary.pad(), task.dictionary.eos(), len(task.dictionary)
    tokens = torch.full((len(lengths), max(lengths)), pad)
    for i, length in enumerate(lengths):
        tokens[i, -length:] = torch.randint(4, n - 1, (length,))
        tokens[i, -1] = eos
    return tokens, torch.tensor(lengths)


# ---------------------------------------------------------------------------------------------- the op
@pytest.mark.parametrize("log_scaled", [False, True])
def test_summary_then_queries_equal_the_kernel_matrix_over_another_length(log_scaled):
    torch.manual_seed(0)
    q, k, v = torch.rand(2, 3, 5, 8, dtype=torch.float64), torch.rand(2, 3, 11, 8, dtype=torch.float64), \
        torch.randn(2, 3, 11, 4, dtype=torch.float64)
    log_scale = torch.randn(2, 3, 11, 1, dtype=torch.float64) * 20 if log_scaled else None
    out = attend_to_summary(q, summarise(k, v, log_scale), eps=0.0)
    torch.testing.assert_close(out, linear_attention_reference(q, k, v, eps=0.0, key_log_scale=log_scale))
    assert summarise(k, v).shape == (2, 3, 8, 5)  # M x (D+1): independent of the 11 source positions


def test_summary_gradients_match_the_reference():
    torch.manual_seed(0)
    q, k = torch.rand(1, 2, 4, 3, dtype=torch.float64, requires_grad=True), \
        torch.rand(1, 2, 7, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 7, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: attend_to_summary(q, summarise(k, v)), (q, k, v))


def test_padded_source_positions_change_nothing():
    torch.manual_seed(0)
    attn = KernelCrossAttention(16, 2, source_dim=24).eval()
    query, source = torch.randn(5, 1, 16), torch.randn(7, 1, 24)
    padded = torch.cat([torch.randn(3, 1, 24) * 100, source])  # left padding with large values
    mask = torch.tensor([[True] * 3 + [False] * 7])
    expected, _ = attn(query, source, source)
    got, weights = attn(query, padded, padded, key_padding_mask=mask, need_weights=True)
    torch.testing.assert_close(got, expected)
    assert weights is None  # no source positions kept: see the module doc


def test_cross_attention_comes_from_the_factory_or_is_fairseqs_softmax():
    model, _ = translation_model()
    layers = model.decoder.layers
    assert all(isinstance(layer.encoder_attn, KernelCrossAttention) for layer in layers)
    assert all(isinstance(layer.self_attn, KernelAttention) and layer.self_attn.causal for layer in layers)
    assert all(not layer.self_attn.causal for layer in model.encoder.layers)
    softmax, _ = translation_model(cross_attention="softmax")
    assert all(type(layer.encoder_attn) is SharedSourceAttention for layer in softmax.decoder.layers)


# ---------------------------------------------------------------------------------------------- decoding
def decode_incrementally(model, encoder_out, prev, reorder_at=None, new_order=None):
    """Token by token through the incremental state; optionally reorder (beam search) before step reorder_at."""
    state = {}
    steps = []
    for t in range(prev.size(1)):
        if t == reorder_at:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            prev = prev.index_select(0, new_order)
            steps = [s.index_select(0, new_order) for s in steps]
        out, _ = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
        steps.append(out[:, -1])
    return torch.stack(steps, 1), prev


@pytest.mark.parametrize("cross_attention", ["kernel", "softmax"])
@pytest.mark.parametrize("feature_map", ["elu", "favor"])
def test_incremental_decoding_equals_the_parallel_forward(cross_attention, feature_map):
    model, task = translation_model(cross_attention=cross_attention, feature_map=feature_map)
    src, lengths = source_batch(task)
    prev = torch.randint(4, len(task.dictionary) - 1, (3, 8))
    prev[:, 0] = task.dictionary.eos()
    with torch.no_grad():
        full, _ = model(src, lengths, prev)
        incremental, _ = decode_incrementally(model, model.encoder(src, src_lengths=lengths), prev)
    torch.testing.assert_close(incremental, full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("new_order", [[1, 1, 3, 2], [2, 3]], ids=["within-sentences", "sentence-finished"])
def test_summary_is_computed_once_and_reordered_with_the_beams(new_order):
    """Two sentences, two beams each; beam search reorders within a sentence or drops a finished one."""
    model, task = translation_model()
    assert_beams_reordered_mid_sentence_decode_as_the_parallel_forward(model, task, new_order)


def assert_beams_reordered_mid_sentence_decode_as_the_parallel_forward(model, task, new_order, eos_first=False):
    """Two sentences, two beams each, decoded token by token and reordered at step 4 (``new_order``), against the
    parallel forward of the reordered targets."""
    src, lengths = source_batch(task, lengths=(9, 4))
    prev = torch.randint(4, len(task.dictionary) - 1, (4, 8))
    if eos_first:
        prev[:, 0] = task.dictionary.eos()
    new_order = torch.tensor(new_order)
    with torch.no_grad():
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths),
                                                        torch.tensor([0, 0, 1, 1]))
        reordered, prev_reordered = decode_incrementally(model, encoder_out, prev, reorder_at=4, new_order=new_order)
        full, _ = model.decoder(prev_reordered, encoder_out=model.encoder.reorder_encoder_out(encoder_out, new_order))
    torch.testing.assert_close(reordered, full, atol=1e-5, rtol=1e-4)
    return src, lengths


def test_summary_is_kept_in_the_incremental_state():
    model, task = translation_model()
    src, lengths = source_batch(task)
    prev = torch.randint(4, len(task.dictionary) - 1, (3, 8))
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
    state = {}
    with torch.no_grad():
        model.decoder(prev[:, :1], encoder_out=encoder_out, incremental_state=state)
    summaries = [v for k, v in state.items() if "attn_state" in k and KernelCrossAttention.SUMMARY_KEY in v]
    assert len(summaries) == SMALL["decoder_layers"]
    assert summaries[0][KernelCrossAttention.SUMMARY_KEY].shape == (3, 4, 8, 9)  # B x H x M x (D+1)
    with torch.no_grad():  # later steps read the summary: a changed encoder output is not looked at again
        a, _ = model.decoder(prev[:, :2], encoder_out=encoder_out, incremental_state=copy.deepcopy(state))
        changed = {**encoder_out, "encoder_out": [torch.randn_like(encoder_out["encoder_out"][0])]}
        b, _ = model.decoder(prev[:, :2], encoder_out=changed, incremental_state=copy.deepcopy(state))
    torch.testing.assert_close(a, b)


def test_fairseqs_beam_search_scores_equal_the_parallel_forward():
    model, task = translation_model()
    src, lengths = source_batch(task)
    assert_beam_search_scores_equal_the_parallel_forward(model, task, src, lengths, beam=5, max_len_b=12)


def assert_beam_search_scores_equal_the_parallel_forward(model, task, src, lengths, beam, max_len_b):
    """fairseq's SequenceGenerator (the incremental decoder, beams reordered at every step) scores each hypothesis
    token as the parallel forward of the whole hypothesis does."""
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=max_len_b, min_len=2)
    with torch.no_grad():
        hypotheses = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    eos = task.dictionary.eos()
    for i, beams in enumerate(hypotheses):
        assert len(beams) == beam
        for hypo in beams:
            target = hypo["tokens"]
            prev = torch.cat([target.new_tensor([eos]), target[:-1]])[None]
            with torch.no_grad():
                logits, _ = model(src[i : i + 1], lengths[i : i + 1], prev)
                log_probs = torch.log_softmax(logits.float(), -1)[0].gather(-1, target[:, None])[:, 0]
            torch.testing.assert_close(hypo["positional_scores"], log_probs, atol=1e-4, rtol=1e-4)


def test_decoding_steps_return_no_attention_weights_and_alignments_come_from_a_full_forward():
    """A decoding step returns no weights over the source unless a layer is named (fairseq's generator would keep
    every step's, a buffer of source x target per hypothesis reordered at every step); named, the step's weights are
    those of the full forward, which is where --print-alignment's come from (full_context_alignment)."""
    model, task = translation_model(defaults={})  # softmax cross-attention: it has weights
    src, lengths = source_batch(task)
    prev = torch.randint(4, len(task.dictionary) - 1, (3, 6))
    prev[:, 0] = task.dictionary.eos()
    last = model.decoder.num_layers - 1
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        _, full = model(src, lengths, prev)
        state, named = {}, []
        for t in range(prev.size(1)):
            _, unnamed = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=copy.deepcopy(state))
            assert unnamed["attn"] == [None]
            _, step = model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state,
                                    alignment_layer=last)
            named.append(step["attn"][0][:, -1])
    assert full["attn"][0].shape == (3, prev.size(1), src.size(1))
    torch.testing.assert_close(torch.stack(named, 1), full["attn"][0], atol=1e-5, rtol=1e-4)

    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        plain = SequenceGenerator([model], task.target_dictionary, beam_size=2, min_len=3, max_len_b=5)
        plain = plain.generate([model], sample)
        aligned = SequenceGeneratorWithAlignment([model], task.target_dictionary, beam_size=2, min_len=3,
                                                 max_len_b=5, print_alignment="hard").generate([model], sample)
    assert all(hypo["attention"].numel() == 0 for beams in plain for hypo in beams)
    for beams, aligned_beams in zip(plain, aligned):
        for hypo, aligned_hypo in zip(beams, aligned_beams):
            assert torch.equal(hypo["tokens"], aligned_hypo["tokens"])
            words = len(hypo["tokens"]) - 1  # every target token but </s> aligned to a source word
            assert sorted(t for _, t in aligned_hypo["alignment"]) == list(range(words))


# ---------------------------------------------------------------------------------------------- attention per role
ROLES = {
    "gated-delta decoder": dict(linear_attention="gated-delta"),
    "softmax encoder, gated-delta decoder, kernel cross": dict(encoder_attention="softmax",
                                                               linear_attention="gated-delta"),
    "softmax encoder, gated-delta decoder, softmax cross": dict(encoder_attention="softmax",
                                                                linear_attention="gated-delta", cross_attention="softmax"),
    "softmax encoder, retention decoder, relu cross": dict(encoder_attention="softmax", linear_attention="retention",
                                                           feature_map="relu"),
    "softmax decoder": dict(linear_attention="softmax"),
    "hybrid decoder, sliding window, carried state": dict(encoder_attention="softmax",
                                                          linear_attention="gated-delta,softmax", softmax_window=4,
                                                          train_state="carried"),
}


@pytest.mark.parametrize("roles", list(ROLES.values()), ids=list(ROLES))
def test_each_role_gets_its_own_attention(roles):
    model, _ = translation_model(**roles)
    decoder_self = [layer.self_attn for layer in model.decoder.layers]
    layout = roles.get("linear_attention", "kernel").split(",")
    classes = {"kernel": KernelAttention, "softmax": CausalSoftmaxAttention, **linear_attentions()}
    assert [type(attn) for attn in decoder_self] == [classes[layout[i % len(layout)]] for i in range(len(decoder_self))]
    encoder_self = [layer.self_attn for layer in model.encoder.layers]
    if roles.get("encoder_attention") == "softmax":
        assert all(type(attn) is MultiheadAttention for attn in encoder_self)  # fairseq's own layer
    else:
        assert all(isinstance(attn, KernelAttention) and not attn.causal for attn in encoder_self)
    cross = [layer.encoder_attn for layer in model.decoder.layers]
    if roles.get("cross_attention") == "softmax":
        assert all(type(attn) is SharedSourceAttention for attn in cross)
    else:
        assert all(isinstance(attn, KernelCrossAttention) for attn in cross)
        expected_map = FEATURE_MAPS[roles.get("feature_map", "elu")]
        assert all(type(attn.feature_map) is expected_map for attn in cross)


@pytest.mark.parametrize("roles", list(ROLES.values()), ids=list(ROLES))
def test_every_role_layout_decodes_as_its_parallel_forward_with_beam_reordering(roles):
    """Target padding exact, the incremental (RNN) decoder equal to the parallel forward, beams reordered
    mid-sentence, and fairseq's beam search scoring its hypotheses as the parallel forward does."""
    model, task = translation_model(**roles)
    src, lengths = assert_beams_reordered_mid_sentence_decode_as_the_parallel_forward(model, task, [1, 1, 3, 2],
                                                                                      eos_first=True)
    assert_beam_search_scores_equal_the_parallel_forward(model, task, src, lengths, beam=3, max_len_b=10)


def test_the_roles_are_part_of_the_checkpoints_identity():
    from fairseq_linattn.models.linear_transformer import LinearTransformerModel

    model, _ = translation_model(encoder_attention="softmax", linear_attention="gated-delta")
    identity = LinearTransformerModel.identity(model.cfg if hasattr(model, "cfg") else model.args)
    assert identity["--encoder-attention"] == "softmax" and identity["--linear-attention"] == "gated-delta"
    assert identity["--cross-attention"] == "kernel" and identity["--feature-map"] == "elu"
