"""Checkpoint files written whole or not at all, and a cheap test of whether one was.

fairseq writes the first checkpoint of a save to a temporary file and renames it (atomic), but then *copies*
it to ``checkpoint_best.pt`` / ``checkpoint_last.pt`` in place: a kill during that copy leaves an empty or
partial ``checkpoint_last.pt``, and the next ``fairseq-train`` dies on it. :func:`atomic_copy` copies to a
temporary name and renames; :func:`unreadable_reason` tells a cut-off file from a whole one without loading
it, so that a restart can fall back to another checkpoint (:mod:`.resume`).
"""
import os
import shutil
import zipfile
from typing import Optional

_ZIP_LOCAL_HEADER = b"PK\x03\x04"
_PICKLE_PROTOCOL = b"\x80"  # torch's legacy (non-zip) format starts with a pickle protocol opcode


def atomic_copy(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` so that ``dst`` is always either its old content or the complete new one.

    The data reaches the disk before the rename (fsync), so that a machine that loses power right after the
    rename does not leave a complete name over incomplete data. A ``.partial`` left by a kill is overwritten
    by the next copy."""
    partial = f"{dst}.partial"
    shutil.copyfile(src, partial)
    with open(partial, "rb") as f:
        os.fsync(f.fileno())
    os.replace(partial, dst)


def unreadable_reason(path: str) -> Optional[str]:
    """Why ``path`` cannot be a whole checkpoint (empty, a zip archive without its end...), or None.

    torch saves a zip archive whose central directory is written last: a file with a readable directory
    was written to the end. Only the directory is read (not the tensors), so this is cheap for any size.
    Legacy (pre-1.6, non-zip) files cannot be checked this way and pass."""
    size = os.path.getsize(path)
    if size == 0:
        return "it is empty (0 bytes)"
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(_PICKLE_PROTOCOL):
        return None
    if head != _ZIP_LOCAL_HEADER:
        return f"it is not a PyTorch checkpoint ({size} bytes, neither a zip archive nor a pickle)"
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"it is truncated ({size} bytes: the zip archive has no intact end, {error})"
    return None
