"""Linear attention whose state decays, is gated or is overwritten: the base of the mechanisms in
:mod:`.mechanisms` (``--linear-attention <name>``: RetNet's retention, GLA, DeltaNet...).

Unlike the kernel attention of :mod:`.kernel` these have no normaliser: o_t = S_t^T q_t with S_t an M x D
state per head, updated by the mechanism's rule (:meth:`RecurrentStateAttention.op_inputs` and the ops in
:mod:`.ops.gated_linear_attn`, :mod:`.ops.delta_rule`, :mod:`.ops.gdn2`). The short convolution, the output gate,
padding and the incremental buffer are :class:`.causal.CausalAttention`'s; here:

* a per-head RMSNorm of the output (always: without a normaliser the output's scale follows the state's), which
  the output gate multiplies: out = RMSNorm(o) * SiLU(W_g x);
* training runs the chunked op (linear in the length); decoding keeps the state (B x H x M x D, fp32) in fairseq's
  ``incremental_state``: one token is one recurrent step, a prompt is the chunked op continued from the state;
* padding is exact: a padded position leaves the state untouched (zero key and value, no decay, no write);
* ``train_state="carried"``: a training sample starts from the final state of the sample in the same batch row
  of the previous update (detached), not from zero: Buitrago & Gu (2025)'s state passing, which lets a model see
  the states that long inputs reach, for lengths past the training one. The state is promoted when fairseq
  announces a new update (``set_num_updates``), so that the micro-batches of one update and activation
  checkpointing's recomputation all start from the same one; evaluation and decoding always start from zero.

A mechanism is a module of :mod:`.mechanisms`: a :class:`RecurrentStateAttention` subclass with a one-line
``SUMMARY`` (for ``--help``), registered with ``@register_linear_attention(name)``: the name becomes a choice of
``--linear-attention``.
"""
from typing import Dict, Optional, Tuple, Type

import torch
from torch import Tensor, nn

from .causal import CausalAttention
from .decay_init import DEFAULT_DECAY_INIT
from .kernel import warn_dropout_ignored
from .registry import make_registry

_REGISTERED, register_linear_attention = make_registry("linear attention")


def linear_attentions() -> Dict[str, Type["RecurrentStateAttention"]]:
    """name -> class of every mechanism: those of the :mod:`.mechanisms` folder (imported here on first use, so
    that none can be missing) and any registered since."""
    from . import mechanisms  # noqa: F401

    return _REGISTERED

Extras = Dict[str, Tensor]  # the mechanism's per-step inputs besides q, k, v (log decays, write strengths)


class RecurrentStateAttention(CausalAttention):
    """Causal multi-head attention with a matrix state; subclasses say how q, k, v and the extras are made
    (:meth:`op_inputs`) and which op runs them (:meth:`chunked`, :meth:`step`)."""

    SUMMARY = ""  # what the mechanism is, in a few words: --linear-attention's help lists it
    MAMBA2_DECAY = False  # True: a decay in Mamba-2's parameterisation, its initial rates from decay_init
    OPTIONS: Tuple[str, ...] = ()  # the mechanism's own options (KernelOptions fields), passed by their names
    DEFAULT_CHUNK_SIZE = 64
    STATE_KEY = "recurrent_state"
    NORM_EPS = 1e-5
    TRAIN_STATES = ("zero", "carried")

    def __init__(self, embed_dim: int, num_heads: int, short_conv: int = CausalAttention.DEFAULT_SHORT_CONV,
                 output_gate: bool = True, chunk_size: int = DEFAULT_CHUNK_SIZE, dropout: float = 0.0,
                 bias: bool = True, q_noise: float = 0.0, qn_block_size: int = 8,
                 decay_init: str = DEFAULT_DECAY_INIT, train_state: str = "zero"):
        super().__init__(embed_dim, num_heads, short_conv, output_gate, dropout, bias, q_noise, qn_block_size)
        self.decay_init = decay_init  # the initial rates of a Mamba-2 decay (MAMBA2_DECAY mechanisms read it)
        self.chunk_size = chunk_size
        if train_state not in self.TRAIN_STATES:
            raise ValueError(f"train_state must be one of {self.TRAIN_STATES}, got {train_state!r}")
        self.train_state = train_state
        # plain attributes, not buffers: a run state, neither saved nor loaded (a resumed run starts from zero)
        self._carried: Optional[Tensor] = None  # this update's initial states (B x H x M x D, fp32, detached)
        self._pending: Optional[Tensor] = None  # the final states of the last forward, for the next update
        self._update: Optional[int] = None
        self.out_norm = nn.RMSNorm(self.head_dim, eps=self.NORM_EPS)
        if dropout > 0:
            warn_dropout_ignored()

    # ------------------------------------------------------------------ what a mechanism implements
    def op_inputs(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor, Tensor, Extras]:
        """x: the layer input (T x B x C); q, k, v: B x H x T x D after the convolution. Returns the op's q, k, v
        and extras (each B x H x T (x F))."""
        raise NotImplementedError

    def chunked(self, q, k, v, extras: Extras, initial_state: Optional[Tensor], return_state: bool):
        raise NotImplementedError

    def step(self, q, k, v, extras: Extras, state: Tensor) -> Tuple[Tensor, Tensor]:
        raise NotImplementedError

    @classmethod
    def benchmark_op(cls, shape, chunk: int, randn):
        """(op, q, k, extras): the chunked op on random inputs of ``shape`` (B x H x n x D) made the way
        :meth:`op_inputs` makes them, leaves where the model's get gradients (the benchmarks time op(q, k, v,
        *extras)); the docstring's first line says how, for the benchmarks' tables."""
        raise NotImplementedError

    # extras that leave the state as it is when 0 (no decay in log space, no write), zeroed at padded positions
    PADDING_NEUTRAL: Tuple[str, ...] = ()

    # ------------------------------------------------------------------ the layer
    def mix(self, x, q, k, v, padding_mask, buffer, need_weights):
        if need_weights:
            raise ValueError(f"{type(self).__name__} computes no attention weights (its state replaces them); "
                             "call it with need_weights=False")
        q, k, v, extras = self.op_inputs(x, q, k, v)
        if padding_mask is not None:
            pads = padding_mask[:, None, :]  # B x 1 x T
            k, v = k.masked_fill(pads.unsqueeze(-1), 0.0), v.masked_fill(pads.unsqueeze(-1), 0.0)
            for name in self.PADDING_NEUTRAL:
                value = extras[name]
                extras[name] = value.masked_fill(pads.view(*pads.shape, *[1] * (value.dim() - 3)), 0.0)
        if buffer is None:
            if not (self.training and self.train_state == "carried"):
                return self.chunked(q, k, v, extras, None, False), None
            out, final = self.chunked(q, k, v, extras, self.carried_state(q, v), True)
            self._pending = final.detach()
            return out, None
        state = buffer.get(self.STATE_KEY)
        if state is None:
            state = q.new_zeros(q.size(0), q.size(1), q.size(-1), v.size(-1), dtype=torch.float32)
        if q.size(2) == 1:
            out, buffer[self.STATE_KEY] = self.step(q, k, v, extras, state)
        else:  # a prompt: the chunked op, continued from the state
            out, buffer[self.STATE_KEY] = self.chunked(q, k, v, extras, state, True)
        return out, None

    def normalise(self, out):
        return self.out_norm(out)

    def carried_state(self, q: Tensor, v: Tensor) -> Optional[Tensor]:
        """The states this update's samples start from: the previous update's final states, row by row (a
        batch with more rows than that gets zeros for the others, one with fewer the first ones)."""
        carried = self._carried
        if carried is None:
            return None
        batch = q.size(0)
        if carried.size(0) < batch:
            carried = torch.cat([carried, carried.new_zeros(batch - carried.size(0), *carried.shape[1:])])
        return carried[:batch].to(q.device)

    def set_num_updates(self, num_updates: int):
        """fairseq calls this before every training forward (each micro-batch of an update with the same number):
        a new number promotes the last forward's final states to the next samples' initial states."""
        if self.train_state == "carried" and num_updates != self._update:
            self._carried, self._pending, self._update = self._pending, None, num_updates

    def extra_repr(self):
        carried = ", train_state=carried" if self.train_state == "carried" else ""
        return f"causal=True, chunk_size={self.chunk_size}{carried}"
