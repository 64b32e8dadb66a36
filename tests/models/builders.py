"""Small models built the way fairseq does (arch defaults applied to a Namespace), without data on disk."""
from fairseq_linattn.models.standalone import DictionaryTask, build_model

# what fairseq resolves from the task's config (the dataclasses' ${task...} interpolations)
TASK_INTERPOLATIONS = dict(add_bos_token=False, tokens_per_sample=64, max_target_positions=None, tpu=False)


class FakeTask(DictionaryTask):
    def __init__(self, vocab_size=40, max_positions=64):
        super().__init__(vocab_size, max_positions)


def build(arch, task=None, **overrides):
    task = task or FakeTask()
    return build_model(arch, task, **{**TASK_INTERPOLATIONS, **overrides}), task


SMALL_ENCODER = dict(
    encoder_layers=2,
    encoder_embed_dim=32,
    encoder_ffn_embed_dim=64,
    encoder_attention_heads=4,
    max_positions=64,
    dropout=0.0,
    attention_dropout=0.0,
)

SMALL_DECODER = dict(decoder_layers=3, decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_attention_heads=4,
                     tokens_per_sample=64, dropout=0.0)
