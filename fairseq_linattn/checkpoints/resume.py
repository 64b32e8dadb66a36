"""Which checkpoint of a save dir a restart should continue from when ``checkpoint_last`` is missing or damaged,
and whether an explicit ``--restore-file`` exists."""
import logging
import os
import re
from typing import Iterable, Optional

from .errors import CheckpointError
from .integrity import unreadable_reason
from .safe_loading import safe_torch_load

logger = logging.getLogger(__name__)

_PROGRESS_IN_NAME = re.compile(r"checkpoint(\d+|_\d+_\d+)\D")  # checkpoint3.pt, checkpoint_3_2000.pt


def trained_updates(path: str) -> int:
    """The number of updates a (whole) checkpoint holds, read without reading its tensors (memory-mapped)."""
    state = safe_torch_load(path, map_location="cpu", mmap=is_zip(path))
    history = state.get("optimizer_history") or [{}]
    return int(history[-1].get("num_updates", 0))


def is_zip(path: str) -> bool:
    """torch's zip format (memory-mappable), as opposed to a legacy pickle."""
    with open(path, "rb") as f:
        return f.read(2) == b"PK"


def newest_intact_checkpoint(save_dir: str, suffix: str = "", exclude: Iterable[str] = (),
                             progress_named_only: bool = False) -> Optional[str]:
    """The whole checkpoint in ``save_dir`` (``checkpoint*{suffix}.pt``, none of ``exclude``) that holds the
    most updates: preferably one named by its progress (``checkpoint_E_U.pt``, ``checkpointE.pt``) over a copy
    of it (``checkpoint_best.pt``), then the most recently written. ``progress_named_only``: only those named
    by their progress (not a best copy, nor a pretrained model someone put there). A file that cannot be read
    is skipped with a warning."""
    if not os.path.isdir(save_dir):
        return None
    pattern = re.compile(r"checkpoint.*" + re.escape(suffix) + r"\.pt$")
    excluded = {os.path.abspath(path) for path in exclude if path}
    ranked = []
    for name in os.listdir(save_dir):
        path = os.path.join(save_dir, name)
        another_shard = not suffix and re.search(r"-(shard|model_part|rank)-?\d+\.pt$", name)
        by_progress = bool(_PROGRESS_IN_NAME.match(name))
        if (not pattern.match(name) or another_shard or not os.path.isfile(path) or os.path.abspath(path) in excluded
                or (progress_named_only and not by_progress) or unreadable_reason(path) is not None):
            continue
        try:
            ranked.append((trained_updates(path), by_progress, os.path.getmtime(path), path))
        except (CheckpointError, OSError) as error:
            logger.warning(f"skipping {path} as a checkpoint to resume from: {error}")
    return max(ranked)[-1] if ranked else None


def check_restore_file_exists(path: str, save_dir: str):
    """fairseq trains from scratch when ``--restore-file`` names no file, and overwrites the save dir: refuse."""
    if "://" in str(path) or os.path.exists(path):
        return
    in_save_dir = os.path.join(save_dir, path)
    hint = (f" A file of that name is in the save dir: pass --restore-file {in_save_dir}."
            if not os.path.isabs(path) and os.path.exists(in_save_dir) else "")
    raise FileNotFoundError(
        f"--restore-file {path} does not exist (relative names are resolved against the working directory "
        f"{os.getcwd()}, not --save-dir).{hint} Training from scratch instead would overwrite the checkpoints "
        f"in {save_dir}, so fairseq-train stops here."
    )
