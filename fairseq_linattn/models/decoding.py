"""What a translation model's decoding steps need not do, for fairseq's SequenceGenerator.

fairseq's beam search expands every source sentence to one row per hypothesis and, at every step, reorders the
encoder output and each layer's cached source keys and values along the hypotheses (``index_select``), although
the rows of one sentence hold the same source: at 2,048 source tokens and beam 5, a step copied those buffers
and read the source five times (in the default ``linear_transformer``, once its own state no longer grew with
the target, most of a step's time; measured with the torch profiler). Here:

* :class:`StepsWithoutWeights`: a decoding step returns no attention weights unless a layer is named.
* :class:`ReadsSourceOnce` (an encoder mixin) and :class:`SharedSourceAttention` (fairseq's softmax
  ``MultiheadAttention`` over the source): the encoder output and the cached keys and values stay one row per
  sentence; the hypotheses of a sentence are consecutive rows (fairseq's ``kv_bsz`` layout, which its attention
  already computes with one product per sentence), and a reorder only moves data when sentences leave the batch.
  A reorder that mixes sentences within a group (no fairseq generator makes one) falls back to one source row per
  hypothesis, as fairseq does.

:func:`lean_decoding` gives fairseq's own transformer both, so that bench_translation compares like with like.
"""
from typing import Optional, Tuple

import torch
from fairseq.modules.multihead_attention import MultiheadAttention
from torch import Tensor

ROWS_PER_SOURCE = "rows_per_source"  # encoder_out's and the attention cache's entry: hypotheses per source row


class StepsWithoutWeights:
    """For a fairseq TransformerDecoder: a decoding step returns no attention weights unless a layer is named.
    fairseq's decoder returns the last layer's weights over the source at every step, and its SequenceGenerator keeps
    them all (hypotheses x source x target so far) and reorders that buffer at every step, a cost that grows with
    the target length (at 2,048 source and target tokens, beam 5, most of a step's time; measured). A full forward
    returns them as fairseq's does, and ``fairseq-generate --print-alignment`` takes them from one (the model's
    ``full_context_alignment``)."""

    def extract_features(self, prev_output_tokens, *args, **kwargs):
        if kwargs.get("incremental_state") is not None and kwargs.get("alignment_layer") is None:
            kwargs["alignment_layer"] = self.num_layers  # past the last layer: none
        return super().extract_features(prev_output_tokens, *args, **kwargs)


def regroup(new_order: Tensor, rows_per_source: int, sources: int) -> Tuple[Optional[Tensor], int]:
    """fairseq's reorder of the hypotheses (``new_order``: the old row of each new row), as (the source rows to keep,
    in order, or None when they stay as they are; the new number of rows per source). A layout this cannot keep
    (a group of rows from several sources) gets one source row per row."""
    source = new_order // rows_per_source
    rows = new_order.numel()
    candidates = [rows_per_source] + ([rows // sources] if rows % sources == 0 else [])
    for per in dict.fromkeys(c for c in candidates if c > 1 and rows % c == 0):
        groups = source.view(-1, per)
        if bool((groups == groups[:, :1]).all()):
            return unchanged_or(groups[:, 0], sources), per
    return unchanged_or(source, sources), 1


def unchanged_or(keep: Tensor, sources: int) -> Optional[Tensor]:
    if keep.numel() == sources and bool((keep == torch.arange(sources, device=keep.device)).all()):
        return None
    return keep


def rows_per_source(store) -> int:
    entry = store.get(ROWS_PER_SOURCE)
    if isinstance(entry, list):
        entry = entry[0] if entry else None
    return 1 if entry is None else int(entry)


class ReadsSourceOnce:
    """For a fairseq TransformerEncoder whose decoder attends to the source with :class:`SharedSourceAttention`:
    ``reorder_encoder_out`` keeps one row per sentence (see the module doc)."""

    def reorder_encoder_out(self, encoder_out, new_order):
        if len(encoder_out["encoder_out"]) == 0:
            return super().reorder_encoder_out(encoder_out, new_order)
        keep, per = regroup(new_order, rows_per_source(encoder_out), encoder_out["encoder_out"][0].size(1))
        out = encoder_out if keep is None else super().reorder_encoder_out(encoder_out, keep)
        return {**out, ROWS_PER_SOURCE: [torch.tensor(per)]}


class SharedSourceAttention(MultiheadAttention):
    """fairseq's encoder-decoder MultiheadAttention whose cached source keys and values stay one row per sentence
    while decoding (it attends from ``rows / sources`` consecutive hypotheses per sentence with one product, fairseq's
    own ``kv_bsz`` path); training and full forwards are fairseq's unchanged."""

    def forward(self, query, key, value, *args, **kwargs):
        out = super().forward(query, key, value, *args, **kwargs)
        incremental_state = kwargs.get("incremental_state")
        if incremental_state is not None:
            buffer = self._get_input_buffer(incremental_state)
            if ROWS_PER_SOURCE not in buffer:  # the first step; later, only a reorder changes it
                buffer[ROWS_PER_SOURCE] = torch.tensor(query.size(1) // buffer["prev_key"].size(0))
                self._set_input_buffer(incremental_state, buffer)
        return out

    def reorder_incremental_state(self, incremental_state, new_order):
        buffer = self._get_input_buffer(incremental_state)
        if "prev_key" not in buffer:
            return incremental_state
        keep, per = regroup(new_order, rows_per_source(buffer), buffer["prev_key"].size(0))
        if keep is not None:
            for name, cached in buffer.items():
                if cached is not None and name != ROWS_PER_SOURCE:
                    buffer[name] = cached.index_select(0, keep)
        buffer[ROWS_PER_SOURCE] = torch.tensor(per)
        return self._set_input_buffer(incremental_state, buffer)


def share_source(attention: MultiheadAttention) -> SharedSourceAttention:
    """fairseq's encoder-decoder attention, built by fairseq's own layer, as :class:`SharedSourceAttention` (the
    same module and parameters: only its decoding cache behaves differently)."""
    assert type(attention) is MultiheadAttention and attention.encoder_decoder_attention, type(attention)
    attention.__class__ = SharedSourceAttention
    return attention


def lean_decoding(model):
    """fairseq's transformer (in place) decoding as ``linear_transformer`` does: steps without weights, the source
    read once per sentence. Returns the model."""
    model.decoder.__class__ = type("Lean" + type(model.decoder).__name__, (StepsWithoutWeights, type(model.decoder)),
                                   {})
    model.encoder.__class__ = type("Lean" + type(model.encoder).__name__, (ReadsSourceOnce, type(model.encoder)), {})
    for layer in model.decoder.layers:
        share_source(layer.encoder_attn)
    return model
