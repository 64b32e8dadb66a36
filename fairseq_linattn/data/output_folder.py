"""A data script's output folder is written whole or not at all.

The data scripts write several files (a sentencepiece model, dictionaries, binarized splits) in steps that can
fail part-way: sentencepiece refusing the text, fairseq-preprocess, a full disk. Written in place, a failure left
a half-made data-bin (or an empty folder) that the next command took for a finished one, or a GLUE task's old
binarized files already deleted. :func:`staged` gives the script a staging folder and moves its content into
the destination only when every step has succeeded, so that a failure leaves the destination as it was: absent
if it did not exist (parent folders it would have created included), its old files otherwise.

The staging folder sits beside a destination that does not exist yet (``.<name>.partial``: one rename then makes
the whole folder appear) and inside one that does (``<destination>/.partial``: its parent may not be writable,
e.g. ``--out .``). One left behind by a killed run is removed by the next run into the same destination.
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .inputs import InputError

PARTIAL = ".partial"


@contextmanager
def staged(destination: str | Path) -> Iterator[Path]:
    """A fresh, empty folder to write ``destination``'s new content into; when the block ends without an error
    that content replaces the same names in ``destination`` (other files there stay), and on any error it is
    removed and ``destination`` is as it was."""
    destination = Path(destination)
    if destination.exists() and not destination.is_dir():
        raise InputError(f"the output folder {destination} is a file: name a folder (it is created if missing)")
    existed = destination.is_dir()
    created = _first_missing(destination.parent)  # the parent folders this run creates, to remove on failure
    staging = destination / PARTIAL if existed else destination.parent / f".{destination.name}{PARTIAL}"
    shutil.rmtree(staging, ignore_errors=True)  # left by a run that was killed
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(created or staging, ignore_errors=True)
        raise
    if not existed:
        os.replace(staging, destination)
        return
    for entry in sorted(staging.iterdir()):
        target = destination / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)  # a folder of the output (a GLUE task's <TASK>-bin): no stale files in it
        elif entry.is_dir() and (target.exists() or target.is_symlink()):
            target.unlink()  # (a file over a file is replaced in one step by os.replace)
        os.replace(entry, target)
    staging.rmdir()


def _first_missing(folder: Path) -> Path | None:
    """The outermost folder on the way to ``folder`` that does not exist yet, or None if it exists."""
    missing = None
    for candidate in [folder, *folder.parents]:
        if candidate.exists():
            break
        missing = candidate
    return missing
