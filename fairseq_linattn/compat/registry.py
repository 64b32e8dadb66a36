"""A module loaded after the plugin that registers one of its model names (fairseq's ``examples/linformer`` registers
``linformer_roberta``, as we do) gets the name: fairseq's ``register_model`` first withdraws ours
(:func:`..models.registry.give_way`, one warning). Every other registration is fairseq's, unchanged."""
import functools


def giving_way(register_model):
    """Wraps ``fairseq.models.register_model(name, dataclass)``."""

    @functools.wraps(register_model)
    def register(name, dataclass=None):
        fairseqs = register_model(name, dataclass)

        def register_cls(cls):
            from fairseq.models import MODEL_REGISTRY

            from ..models.registry import give_way
            from ..ownership import is_ours

            held = MODEL_REGISTRY.get(name)
            if held is not None and held is not cls and is_ours(held) and not is_ours(cls):
                give_way(name, cls)
            return fairseqs(cls)

        return register_cls

    register.patched_by_fairseq_linattn = True
    return register


def apply():
    from fairseq import models

    if not getattr(models.register_model, "patched_by_fairseq_linattn", False):
        models.register_model = giving_way(models.register_model)
