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


def dataclass_defaults(arch):
    """The argparse defaults fairseq-train would give a dataclass model (None for argparse-only models)."""
    import argparse

    from fairseq.dataclass.utils import gen_parser_from_dataclass
    from fairseq.models import MODEL_DATACLASS_REGISTRY

    model_class = ARCH_MODEL_REGISTRY[arch]
    name = next((n for n in MODEL_DATACLASS_REGISTRY if ARCH_MODEL_REGISTRY.get(n) is model_class), None)
    if name is None:
        return {}
    parser = argparse.ArgumentParser()
    gen_parser_from_dataclass(parser, MODEL_DATACLASS_REGISTRY[name]())
    defaults = vars(parser.parse_args([]))
    # interpolations that fairseq resolves from the task config
    defaults.update(add_bos_token=False, tokens_per_sample=64, max_target_positions=None, tpu=False)
    return defaults


def build(arch, task=None, **overrides):
    task = task or FakeTask()
    args = Namespace(**{**dataclass_defaults(arch), **overrides})
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
