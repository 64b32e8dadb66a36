"""fairseq's checkpoint handling, made safe to load and safe to kill.

* Loading: fairseq 0.12 calls ``torch.load`` with torch's default, which since torch 2.6 refuses fairseq's own
  checkpoints (they pickle their config). Instead of ``weights_only=False`` (any file could run code), load
  with ``weights_only=True`` and the allow-list of :mod:`fairseq_linattn.checkpoints.safe_loading`, both
  where fairseq reads checkpoint files and where rank 0 broadcasts the loaded state to the other workers.
* Old checkpoints: options whose meaning changed since they were saved are rewritten as they were read
  then (:mod:`fairseq_linattn.checkpoints.upgrade`).
* Writing: fairseq copies the saved checkpoint to ``checkpoint_best.pt`` / ``checkpoint_last.pt`` in place;
  a kill during the copy left a partial ``checkpoint_last.pt``. The copy now goes to a temporary file that
  is renamed (atomic).
* Resuming, for runs of our models, tasks and criteria (:mod:`.scope`; fairseq's own resume as fairseq resumes them
  unless ``FAIRSEQ_LINATTN_ALL_MODELS=1``): a damaged ``checkpoint_last.pt`` (from older runs, a full disk...) makes
  ``fairseq-train`` fall back to the newest intact checkpoint of the save dir, with a warning naming it, instead of
  dying; so does a missing one when the save dir holds checkpoints named by their progress (a run killed during its
  first save of ``checkpoint_last.pt``). An explicit ``--restore-file`` that does not exist is an error (fairseq
  trained from scratch, silently, and overwrote the save dir's checkpoints); ``--restore-file $SAVE/checkpoint_last.pt``
  stays a resume. fairseq's idioms keep their meaning for its own models: deleting ``checkpoint_last.pt`` starts
  over, and a ``--restore-file`` that does not exist starts fresh.

Loading and writing apply to every model: without them fairseq 0.12 cannot load its own checkpoints under torch >=
2.6, and an atomic copy writes the same bytes.
"""
import logging
import os
import types

import torch

from ..checkpoints import (
    CheckpointError,
    atomic_copy,
    check_restore_file_exists,
    check_same_attention,
    newest_intact_checkpoint,
    safe_torch_load,
    unreadable_reason,
    upgrade_checkpoint_options,
)
from . import scope

logger = logging.getLogger(__name__)

DEFAULT_RESTORE_FILE = "checkpoint_last.pt"


class TorchWithSafeLoad(types.ModuleType):
    """Stands in for ``torch`` inside one fairseq module: ``load`` is :func:`safe_torch_load` (with the
    module's extra allowed types), every other attribute is torch's own."""

    def __init__(self, extra_globals=()):
        super().__init__("torch")
        self._extra_globals = tuple(extra_globals)

    def __getattr__(self, name):
        return getattr(torch, name)

    def load(self, f, *args, **kwargs):
        return safe_torch_load(f, *args, extra_globals=self._extra_globals, **kwargs)


class PathManagerWithAtomicCopy:
    """Stands in for fairseq's ``PathManager`` inside ``checkpoint_utils``: local copies are atomic."""

    def __init__(self, path_manager):
        self._path_manager = path_manager

    def __getattr__(self, name):
        return getattr(self._path_manager, name)

    def copy(self, src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if _is_local(src_path) and _is_local(dst_path) and (overwrite or not os.path.exists(dst_path)):
            atomic_copy(src_path, dst_path)
            return True
        return self._path_manager.copy(src_path, dst_path, overwrite)


def _is_local(path: str) -> bool:
    return "://" not in str(path)


def resuming_from_intact_checkpoints(load_checkpoint):
    """Wraps ``checkpoint_utils.load_checkpoint(cfg, trainer, ...)``, the start of every fairseq-train."""

    def load(cfg, trainer, **passthrough_args):
        if not scope.applies(cfg=getattr(trainer, "cfg", None)):
            return load_checkpoint(cfg, trainer, **passthrough_args)  # fairseq's own models: fairseq's resume
        suffix = trainer.checkpoint_suffix or ""
        last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
        if cfg.restore_file != DEFAULT_RESTORE_FILE:
            path = cfg.restore_file.replace(".pt", suffix + ".pt")
            if not _same_file(path, last):  # (--restore-file $SAVE/checkpoint_last.pt is a resume: see below)
                check_restore_file_exists(path, cfg.save_dir)
                if _is_local(path):
                    check_same_attention(path, trainer.cfg.model, "this run (--restore-file)")
                return load_checkpoint(cfg, trainer, **passthrough_args)
        if not _is_local(last):
            return load_checkpoint(cfg, trainer, **passthrough_args)
        exists = os.path.isfile(last)
        problem = unreadable_reason(last) if exists else None
        if exists and problem is None:
            check_same_attention(last, trainer.cfg.model, "this run (resuming from --save-dir)")
            return load_checkpoint(cfg, trainer, **passthrough_args)
        if not exists and (cfg.no_last_checkpoints or suffix):
            return load_checkpoint(cfg, trainer, **passthrough_args)  # fairseq never resumes such a run
        fallback = None
        if not suffix:  # sharded checkpoints (one file per rank) would each pick their own: no fallback
            # without checkpoint_last only a checkpoint named by its progress (not a pretrained model kept there)
            fallback = newest_intact_checkpoint(
                cfg.save_dir, suffix, exclude=[last, cfg.get("finetune_from_model"), cfg.get("continue_once")],
                progress_named_only=not exists)
        if fallback is None and exists:
            raise CheckpointError(
                f"cannot resume from {last}: {problem}, and {cfg.save_dir} holds no other intact checkpoint "
                f"{'of this shard ' if suffix else ''}to fall back to. Move the damaged file away to start the run "
                "from scratch, or restore another checkpoint with --restore-file."
            )
        if fallback is None:
            return load_checkpoint(cfg, trainer, **passthrough_args)  # a new run
        why = problem if exists else "it does not exist (a run stopped during its first save?)"
        logger.warning(f"{last} cannot be loaded ({why}); resuming from {fallback}, the intact checkpoint with the "
                       f"most updates in {cfg.save_dir}")
        check_same_attention(fallback, trainer.cfg.model, "this run (resuming from --save-dir)")
        return _loading_instead(load_checkpoint, cfg, trainer, passthrough_args, last, fallback)

    load.__wrapped__ = load_checkpoint
    return load


def _same_file(a: str, b: str) -> bool:
    return _is_local(a) and os.path.abspath(a) == os.path.abspath(b)


def _loading_instead(load_checkpoint, cfg, trainer, passthrough_args, last: str, fallback: str):
    """fairseq's resume from ``last``, reading ``fallback`` in its place (on every worker alike)."""
    load_file = trainer.load_checkpoint

    def load_fallback_instead(filename, *args, **kwargs):
        return load_file(fallback if _same_file(filename, last) else filename, *args, **kwargs)

    # without checkpoint_last fairseq takes the run for a new one and would start --finetune-from-model or
    # --continue-once over again: it is not new
    first_launch_options = {k: cfg[k] for k in ("finetune_from_model", "continue_once") if cfg.get(k) is not None}
    trainer.load_checkpoint = load_fallback_instead
    try:
        for name in first_launch_options:
            cfg[name] = None
        return load_checkpoint(cfg, trainer, **passthrough_args)
    finally:
        for name, value in first_launch_options.items():
            cfg[name] = value
        del trainer.load_checkpoint  # back to the class's method


def refusing_identity_overrides(load_checkpoint_to_cpu):
    """Wraps ``checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides)`` (validate, eval-lm, generate,
    the hub, resuming): overriding an option that changes what the weights mean is an error, not a silent misuse;
    an older checkpoint's options are read as that version read them (:mod:`..checkpoints.upgrade`)."""
    from ..attention.options import identity_option_names

    def load(path, arg_overrides=None, load_on_all_ranks=False):
        state = upgrade_checkpoint_options(load_checkpoint_to_cpu(path, arg_overrides, load_on_all_ranks), path)
        touched = set(arg_overrides or ()) & identity_option_names()  # else the saved cfg need not be read again
        if touched and _is_local(path) and state.get("cfg") is not None:
            check_same_attention(path, state["cfg"].model, "the options given to this command (--model-overrides)")
        return state

    load.__wrapped__ = load_checkpoint_to_cpu
    return load


def surfacing_checkpoint_errors(load_checkpoint):
    """Wraps ``Trainer.load_checkpoint``, which turns any error while loading the weights into a bare
    "Cannot load model parameters ...; please ensure that the architectures match": ours name the cause."""
    from ..attention.workers import WorkersDisagreeError

    def load(self, *args, **kwargs):
        try:
            return load_checkpoint(self, *args, **kwargs)
        except Exception as error:
            cause = error.__context__
            if type(error) is Exception and isinstance(cause, (CheckpointError, WorkersDisagreeError)):
                raise cause from None
            raise

    load.__wrapped__ = load_checkpoint
    return load


def apply():
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils
    from fairseq.trainer import Trainer

    checkpoint_utils.torch = TorchWithSafeLoad()
    checkpoint_utils.PathManager = PathManagerWithAtomicCopy(checkpoint_utils.PathManager)
    checkpoint_utils.load_checkpoint = resuming_from_intact_checkpoints(checkpoint_utils.load_checkpoint)
    checkpoint_utils.load_checkpoint_to_cpu = refusing_identity_overrides(checkpoint_utils.load_checkpoint_to_cpu)
    Trainer.load_checkpoint = surfacing_checkpoint_errors(Trainer.load_checkpoint)
    # rank 0 loads the checkpoint and broadcasts it; the others unpickle it with torch.load too
    distributed_utils.torch = TorchWithSafeLoad(extra_globals=[distributed_utils._TensorPlaceholder])
