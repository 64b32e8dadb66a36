"""How our model families reach fairseq's registries (``register_model``, ``register_archs``), and how they give way
to another module that registers one of their names.

A family swaps our attention into a fairseq model and takes over that model's sizes, one for one: each size is
fairseq's own arch function, run after the attention options' defaults (fairseq's arch functions fill only
the options they know).

fairseq keeps one model per name. Its own ``examples/linformer`` (``--user-dir examples/linformer/linformer_src``)
registers ``linformer_roberta`` and its ``_base`` / ``_large`` archs, as we do. In a process that loads both, the
names go to that module, the one the user named, whichever is loaded first: loaded after us, it takes them over
(:func:`give_way`, called from the hook in :mod:`..compat.registry`); loaded before us, ours are not registered. Each
is one warning. (The later import failed with "Cannot register duplicate model architecture", and a second
``--user-dir`` of fairseq's example then "succeeded" by fairseq's memo of imported user dirs, training our model
under fairseq's name.) Our other models are unaffected.
"""
import logging
from typing import Callable, Dict, Optional

from fairseq import models as fairseq_models

from ..ownership import is_ours

logger = logging.getLogger(__name__)

DECLINED = set()  # our model names another module held when we came to register them


def registered_name(cls) -> str:
    """The name ``cls`` is registered under with ``register_model`` (the class name if none)."""
    return next((name for name, model in fairseq_models.MODEL_REGISTRY.items() if model is cls), cls.__name__)


def register_model(name: str, dataclass=None):
    """fairseq's ``register_model``, unless another module holds ``name`` already: then ours is left out, with a
    warning (fairseq 0.12.3 would hand our module the other class under our class's name)."""

    def register(cls):
        held = fairseq_models.MODEL_REGISTRY.get(name)
        if held is not None and not is_ours(held):
            logger.warning(f"--arch {name} is {held.__module__}'s in this process, not fairseq_linattn's (fairseq keeps "
                           f"one model per name): fairseq_linattn's {name} is not registered here; load it in a process "
                           f"without {held.__module__.split('.')[0]}")
            DECLINED.add(name)
            return cls
        return fairseq_models.register_model(name, dataclass)(cls)

    return register


def register_archs(model_name: str, sizes: Dict[str, Callable], defaults: Optional[Callable] = None):
    """``<model_name>_<size>`` for each of ``sizes`` (size -> fairseq's arch function; the size "" registers
    ``<model_name>`` itself), each calling ``defaults(args)`` (e.g. ``MyOptions.set_defaults``) first. Nothing
    when ``model_name`` was another module's (:func:`register_model` declined it)."""
    if model_name in DECLINED:
        return
    for size, fairseq_arch in sizes.items():
        def arch(args, fairseq_arch=fairseq_arch):
            if defaults is not None:
                defaults(args)
            fairseq_arch(args)

        fairseq_models.register_model_architecture(model_name, f"{model_name}_{size}" if size else model_name)(arch)


def give_way(name: str, to):
    """Withdraw our model ``name`` and its archs from fairseq's registries (and hydra's config store), so that the
    class ``to``, of another module, can be registered under it."""
    from hydra.core.config_store import ConfigStore

    fairseq_models.MODEL_REGISTRY.pop(name)
    fairseq_models.MODEL_DATACLASS_REGISTRY.pop(name, None)
    archs = fairseq_models.ARCH_MODEL_INV_REGISTRY.pop(name, [])
    for arch in archs:
        for registry in (fairseq_models.ARCH_MODEL_REGISTRY, fairseq_models.ARCH_MODEL_NAME_REGISTRY,
                         fairseq_models.ARCH_CONFIG_REGISTRY):
            registry.pop(arch, None)
    ConfigStore.instance().repo.get("model", {}).pop(f"{name}.yaml", None)
    logger.warning(f"--arch {name} ({', '.join(archs)}) is now {to.__module__}'s, not fairseq_linattn's: fairseq keeps "
                   f"one model per name, and {to.__module__.split('.')[0]} was loaded after fairseq_linattn; the "
                   f"plugin's other models are unchanged")
