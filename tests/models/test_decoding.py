"""models/decoding.py: beam search reads each source once per sentence, and decodes exactly as fairseq's rows do."""
import copy

import pytest
import torch
from fairseq.models.transformer import TransformerEncoder
from fairseq.modules import MultiheadAttention
from fairseq.sequence_generator import SequenceGenerator

from fairseq_linattn.models.decoding import ROWS_PER_SOURCE, SharedSourceAttention, lean_decoding, regroup
from fairseq_linattn.models.linear_transformer import LinearTransformerEncoder

from .builders import build
from .test_linear_transformer import SMALL, source_batch, translation_model


@pytest.mark.parametrize("new_order, per, sources, keep, new_per", [
    ([0, 0, 0, 1, 1, 1], 1, 2, None, 3),              # the generator's expansion: beam 3
    ([2, 0, 0, 5, 3, 3], 3, 2, None, 3),              # a step: hypotheses move within their sentence
    ([5, 3, 3], 3, 2, [1], 3),                        # the first sentence finished
    ([0, 1, 2], 1, 3, None, 1),                       # beam 1, nothing moves
    ([2, 0], 1, 3, [2, 0], 1),                        # beam 1, a sentence finished and the order changed
    ([0, 3, 1, 4], 2, 3, [0, 1, 0, 2], 1),            # a group mixing sentences: one source row per row
], ids=["expand", "step", "finished", "beam1", "beam1-finished", "mixed"])
def test_regroup_keeps_one_source_row_per_sentence_and_moves_data_only_when_sentences_leave(new_order, per, sources,
                                                                                            keep, new_per):
    got_keep, got_per = regroup(torch.tensor(new_order), per, sources)
    assert got_per == new_per
    assert (got_keep is None and keep is None) or got_keep.tolist() == keep


def fairseqs_rows(model):
    """The same model with fairseq's encoder reorder and attention cache (one source row per hypothesis)."""
    plain = copy.deepcopy(model)
    plain.encoder.__class__ = next(c for c in type(model.encoder).__mro__
                                   if c in (TransformerEncoder, LinearTransformerEncoder))
    for layer in plain.decoder.layers:
        layer.encoder_attn.__class__ = MultiheadAttention
    return plain


def ending_at_different_steps(model, eos):
    """The end-of-sentence logit tied to a feature, so that sentences and hypotheses finish at different steps (a
    random model would run every hypothesis to the length limit)."""
    output_layer = model.decoder.output_layer

    def biased(features):
        logits = output_layer(features)
        logits[..., eos] += 4 * features[..., 0]
        return logits

    model.decoder.output_layer = biased
    return model


def generate(model, task, src, lengths, beam):
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=14)
    columns = []  # the encoder output's width after every reorder
    reorder = model.encoder.reorder_encoder_out

    def recording(encoder_out, new_order):
        out = reorder(encoder_out, new_order)
        columns.append(out["encoder_out"][0].size(1))
        return out

    model.encoder.reorder_encoder_out = recording
    with torch.no_grad():
        hypotheses = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    del model.encoder.reorder_encoder_out
    return hypotheses, columns


def assert_same_beam_search(shared, plain, task, beam):
    src, lengths = source_batch(task, lengths=(11, 7, 3, 9))
    eos = task.target_dictionary.eos()
    shared, plain = ending_at_different_steps(shared, eos), ending_at_different_steps(plain, eos)
    ours, columns = generate(shared, task, src, lengths, beam)
    theirs, fairseq_columns = generate(plain, task, src, lengths, beam)
    for a, b in zip(ours, theirs):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
        torch.testing.assert_close(torch.stack([h["score"] for h in a]), torch.stack([h["score"] for h in b]))
        torch.testing.assert_close(torch.stack([h["positional_scores"].sum() for h in a]),
                                   torch.stack([h["positional_scores"].sum() for h in b]))
    assert len({len(a[0]["tokens"]) for a in ours}) > 1  # sentences ended at different steps...
    assert min(fairseq_columns) < max(fairseq_columns)   # ...and left the batch
    assert max(columns) == len(lengths)                  # one source row per sentence, never one per hypothesis
    assert max(fairseq_columns) == len(lengths) * beam


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("encoder_attention", ["softmax", "kernel"])
def test_linear_transformer_beam_search_equals_fairseqs_rows(encoder_attention, beam):
    model, task = translation_model(defaults={}, encoder_attention=encoder_attention)
    assert all(type(layer.encoder_attn) is SharedSourceAttention for layer in model.decoder.layers)
    assert_same_beam_search(model, fairseqs_rows(model), task, beam)


@pytest.mark.parametrize("beam", [1, 4])
def test_lean_decoding_gives_fairseqs_transformer_the_same_search(beam):
    torch.manual_seed(0)
    model, task = build("transformer", **SMALL)
    lean = lean_decoding(copy.deepcopy(model.eval()))
    assert all(type(layer.encoder_attn) is SharedSourceAttention for layer in lean.decoder.layers)
    assert_same_beam_search(lean, model, task, beam)


def test_kernel_cross_attention_keeps_fairseqs_rows():
    """Kernel cross-attention keeps its own per-hypothesis summary: its encoder is fairseq's, unchanged."""
    model, _ = translation_model(defaults={}, cross_attention="kernel")
    assert type(model.encoder) is TransformerEncoder


def test_the_cache_records_its_rows_per_source():
    model, task = translation_model(defaults={})
    src, lengths = source_batch(task, lengths=(5, 3))
    with torch.no_grad():
        encoder_out = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths),
                                                        torch.tensor([0, 0, 0, 1, 1, 1]))
        state = {}
        prev = torch.full((6, 1), task.dictionary.eos())
        model.decoder(prev, encoder_out=encoder_out, incremental_state=state)
    assert encoder_out["encoder_out"][0].size(1) == 2 and int(encoder_out[ROWS_PER_SOURCE][0]) == 3
    caches = [model.decoder.layers[i].encoder_attn._get_input_buffer(state) for i in range(SMALL["decoder_layers"])]
    assert all(cache["prev_key"].size(0) == 2 and int(cache[ROWS_PER_SOURCE]) == 3 for cache in caches)
