"""Which runs the plugin's behaviour changes apply to: its own, unless the user opts in for every model.

A run is the plugin's when its command line or config names one of the plugin's models (``--arch``), tasks or
criteria, or when every checkpoint it loads (``--path``) holds one of its models; a call is the plugin's when the
models it is handed are. ``FAIRSEQ_LINATTN_ALL_MODELS=1`` applies the changes to fairseq's own models too.

The commands fairseq starts through ``distributed_utils.call_main`` (train, validate, eval-lm, interactive, hydra-train)
and fairseq-generate's ``main`` run inside :func:`run`, which records the answer for the code that cannot see the
run's config (dataset filtering); code that can see the config or the models asks :func:`applies` with them.
"""
import contextlib
import contextvars
import functools
import os
from argparse import Namespace
from typing import Iterable, Optional

from omegaconf import DictConfig

from ..ownership import is_ours

OPT_IN_VARIABLE = "FAIRSEQ_LINATTN_ALL_MODELS"
_TRUE = ("1", "y", "yes", "true")

_RUN_IS_OURS = contextvars.ContextVar("fairseq_linattn_run_is_ours", default=False)


def opted_in() -> bool:
    """The user asked for the plugin's behaviour changes on every model (``FAIRSEQ_LINATTN_ALL_MODELS=1``)."""
    return os.environ.get(OPT_IN_VARIABLE, "").strip().lower() in _TRUE


def _get(container, key: str):
    """``container[key]`` for the configs fairseq passes (omegaconf, dict, Namespace), None for anything else (a
    test's MagicMock answers every attribute: it names no run)."""
    if isinstance(container, (DictConfig, dict)):
        return container.get(key)
    if isinstance(container, Namespace):
        return getattr(container, key, None)
    return None


def _names(cfg):
    """(model or arch, task, criterion, checkpoint paths) named by a parsed command line or a fairseq config."""
    if isinstance(cfg, Namespace) and not isinstance(_get(cfg, "model"), (DictConfig, dict, Namespace)):
        return _get(cfg, "arch") or _get(cfg, "_name"), _get(cfg, "task"), _get(cfg, "criterion"), _get(cfg, "path")
    model, task, criterion = (_get(cfg, group) for group in ("model", "task", "criterion"))
    return (_get(model, "arch") or _get(model, "_name"), _get(task, "_name"), _get(criterion, "_name"),
            _get(_get(cfg, "common_eval"), "path"))


def names_ours(cfg) -> bool:
    """Whether ``cfg`` (a parsed command line or a fairseq config) names a model, task or criterion of this package,
    or only checkpoints that hold one of its models."""
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    model, task, criterion, paths = _names(cfg)
    found = [ARCH_MODEL_REGISTRY.get(model) or MODEL_REGISTRY.get(model) if isinstance(model, str) else None,
             TASK_REGISTRY.get(task) if isinstance(task, str) else None,
             CRITERION_REGISTRY.get(criterion) if isinstance(criterion, str) else None]
    if any(cls is not None and is_ours(cls) for cls in found):
        return True
    return isinstance(paths, str) and bool(paths) and all(_checkpoint_is_ours(p) for p in paths.split(os.pathsep))


def _checkpoint_is_ours(path: str) -> bool:
    """Whether the checkpoint at ``path`` holds one of our models; a file that is missing or unreadable holds nothing
    we know of. (A command asks twice, when its line is parsed and when it runs: the file is read once.)"""
    if "://" in path or not os.path.isfile(path):
        return False
    stat = os.stat(path)
    return _holds_our_model(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _holds_our_model(path: str, mtime_ns: int, size: int) -> bool:
    """(Cached by the file's path, time and size: a rewritten file is read again.) Its config, without its tensors."""
    from ..checkpoints.fit import model_class, saved_model_cfg

    try:
        return model_class(saved_model_cfg(path)) is not None
    except Exception:  # noqa: BLE001 - damaged, foreign, unsafe: fairseq's own loading reports it
        return False


def models_are_ours(models: Iterable) -> bool:
    models = list(models)
    return bool(models) and all(is_ours(model) for model in models)


def applies(cfg=None, models: Optional[Iterable] = None) -> bool:
    """Whether a behaviour change applies here: the user opted in, the current :func:`run` is ours, ``cfg`` names
    something of ours (:func:`names_ours`), or ``models`` are ours."""
    if opted_in() or _RUN_IS_OURS.get():
        return True
    if models is not None and models_are_ours(models):
        return True
    return cfg is not None and names_ours(cfg)


@contextlib.contextmanager
def run(cfg):
    """The extent of one command: inside it, :func:`applies` answers for ``cfg``'s run."""
    token = _RUN_IS_OURS.set(_RUN_IS_OURS.get() or names_ours(cfg))
    try:
        yield
    finally:
        _RUN_IS_OURS.reset(token)
