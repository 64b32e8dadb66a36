"""Build a registered fairseq model by arch name without data on disk (benchmarks, tests, notebooks).

What fairseq-train does with a model, minus the task: the model's dataclass defaults in a Namespace, the
overrides, the arch function, ``build_model(args, task)``, with a task that only carries a dictionary.
"""
import dataclasses
from argparse import Namespace

from fairseq.data import Dictionary
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_NAME_REGISTRY,
    ARCH_MODEL_REGISTRY,
    MODEL_DATACLASS_REGISTRY,
)
from torch import nn


class DictionaryTask:
    """What ``build_model`` needs from a task: the dictionaries (with ``<mask>``) and ``max_positions``."""

    def __init__(self, vocab_size: int = 100, max_positions: int = 512):
        self.source_dictionary = self.target_dictionary = self.dictionary = Dictionary()
        for i in range(vocab_size):
            self.dictionary.add_symbol(f"w{i}")
        self.dictionary.add_symbol("<mask>")
        self._max_positions = max_positions

    def max_positions(self):
        return self._max_positions


def arch_defaults(arch: str) -> dict:
    """The model's dataclass defaults, or {} for a model without a dataclass (its arch function fills
    everything). Fields that interpolate the task's config (``${task...}``) are left out: pass them as
    overrides."""
    model_name = ARCH_MODEL_NAME_REGISTRY[arch]
    if model_name not in MODEL_DATACLASS_REGISTRY:
        return {}
    config = MODEL_DATACLASS_REGISTRY[model_name]()
    values = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    return {name: value for name, value in values.items() if not (isinstance(value, str) and value.startswith("${"))}


def build_model(arch: str, task, **overrides) -> nn.Module:
    args = Namespace(**{**arch_defaults(arch), **overrides})
    ARCH_CONFIG_REGISTRY[arch](args)
    args.arch = arch
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task)
