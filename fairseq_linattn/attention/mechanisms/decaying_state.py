"""Linear attention with a decaying state, the base of :mod:`.retention` and :mod:`.gla`:

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t

run by the chunked op and the recurrent step of :mod:`..ops.gated_linear_attn`; a mechanism only makes g_t.
"""
from ..ops.gated_linear_attn import chunk_gated_linear_attention, recurrent_gated_linear_attention_step
from ..recurrent_state import RecurrentStateAttention


class DecayingStateAttention(RecurrentStateAttention):
    """The shared part: extras = {"log_decay": B x H x T x (1 or D)}, run by the gated linear-attention ops."""

    PADDING_NEUTRAL = ("log_decay",)

    def chunked(self, q, k, v, extras, initial_state, return_state):
        return chunk_gated_linear_attention(q, k, v, extras["log_decay"], self.chunk_size, initial_state,
                                            return_state)

    def step(self, q, k, v, extras, state):
        return recurrent_gated_linear_attention_step(q, k, v, extras["log_decay"], state)
