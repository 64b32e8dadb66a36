"""The one way a model family's sizes reach fairseq: ``register_archs(model_name, sizes, defaults)``.

A family swaps our attention into a fairseq model and takes over that model's sizes, one for one: each size is
fairseq's own arch function, run after the attention options' defaults (fairseq's arch functions fill only
the options they know)."""
from typing import Callable, Dict, Optional

from fairseq.models import register_model_architecture


def register_archs(model_name: str, sizes: Dict[str, Callable], defaults: Optional[Callable] = None):
    """``<model_name>_<size>`` for each of ``sizes`` (size -> fairseq's arch function; the size "" registers
    ``<model_name>`` itself), each calling ``defaults(args)`` (e.g. ``MyOptions.set_defaults``) first."""
    for size, fairseq_arch in sizes.items():
        def arch(args, fairseq_arch=fairseq_arch):
            if defaults is not None:
                defaults(args)
            fairseq_arch(args)

        register_model_architecture(model_name, f"{model_name}_{size}" if size else model_name)(arch)
