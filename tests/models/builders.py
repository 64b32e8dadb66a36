"""Build small models the way fairseq does (arch defaults applied to a Namespace), without data on disk."""
from argparse import Namespace

from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY


class FakeTask:
    def __init__(self, vocab_size=40, max_positions=64):
        self.source_dictionary = self.target_dictionary = self.dictionary = Dictionary()
        for i in range(vocab_size):
            self.dictionary.add_symbol(f"w{i}")
        self.dictionary.add_symbol("<mask>")
        self._max_positions = max_positions

    def max_positions(self):
        return self._max_positions


def build(arch, task=None, **overrides):
    task = task or FakeTask()
    args = Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    args.arch = arch
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), task


SMALL_ENCODER = dict(
    encoder_layers=2,
    encoder_embed_dim=32,
    encoder_ffn_embed_dim=64,
    encoder_attention_heads=4,
    max_positions=64,
    dropout=0.0,
    attention_dropout=0.0,
)
