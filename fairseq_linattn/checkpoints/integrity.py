"""Checkpoint files written whole or not at all, and a cheap test of whether one was.

fairseq writes the first checkpoint of a save to a temporary file and renames it (atomic), but then *copies*
it to ``checkpoint_best.pt`` / ``checkpoint_last.pt`` in place: a kill during that copy leaves an empty or
partial ``checkpoint_last.pt``, and the next ``fairseq-train`` dies on it. :func:`atomic_copy` copies to a
temporary name and renames; :func:`unreadable_reason` tells a cut-off file from a whole one without loading
it, so that a restart can fall back to another checkpoint (:mod:`.resume`), and both from a file that is no
checkpoint at all (a wrong path), which no kill explains.
"""
import os
import shutil
import zipfile
from typing import Optional

_ZIP_LOCAL_HEADER = b"PK\x03\x04"
_PICKLE_PROTOCOL = b"\x80"  # torch's legacy (non-zip) format starts with a pickle protocol opcode
# ... and pickles this number first (torch.serialization.MAGIC_NUMBER, as pickle's LONG1 opcode writes it), within
# its first bytes whatever the protocol (protocol 4 puts a frame header before it)
_LEGACY_MAGIC = b"\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_HEAD = 64
_LEGACY_HEADER_END = 2 + 9 + len(_LEGACY_MAGIC)  # protocol, protocol 4's frame header, the number
NOT_A_CHECKPOINT = "it is not a PyTorch checkpoint"
# formats a checkpoint path is mistaken for, told by their first bytes
_KNOWN_FORMATS = ((b"\x1f\x8b", "a gzip file"), (b"\x89HDF", "an HDF5 file (Keras/TensorFlow weights?)"),
                  (b"\x93NUMPY", "a numpy .npy array"))


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
    """Why ``path`` cannot be a whole checkpoint (empty, a zip archive without its end, not a checkpoint at all...),
    or None.

    torch saves a zip archive whose central directory is written last: a file with a readable directory
    was written to the end. Only the directory is read (not the tensors), so this is cheap for any size.
    Legacy (pre-1.6, non-zip) files cannot be checked this way and pass when they start as torch writes them.
    A reason that starts with :data:`NOT_A_CHECKPOINT` is a file of another kind, not a damaged checkpoint."""
    size = os.path.getsize(path)
    if size == 0:
        return "it is empty (0 bytes)"
    with open(path, "rb") as f:
        head = f.read(_HEAD)
    if head.startswith(_PICKLE_PROTOCOL):
        if _LEGACY_MAGIC in head or size < _LEGACY_HEADER_END:
            return None  # (a legacy file cut within its header fails to unpickle: reported as damaged)
        return f"{NOT_A_CHECKPOINT} ({size} bytes, a Python pickle but not one that torch.save wrote)"
    if head[:4] != _ZIP_LOCAL_HEADER:
        return f"{NOT_A_CHECKPOINT} ({looks_like(head, size)}; torch.save writes a zip archive, or before torch 1.6 " \
               "a pickle)"
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"it is truncated ({size} bytes: the zip archive has no intact end, {error})"
    if not any(name == "data.pkl" or name.endswith("/data.pkl") for name in names):
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return f"{NOT_A_CHECKPOINT} (a zip archive of {size} bytes without the data.pkl torch.save writes: {shown or 'empty'})"
    return None


def looks_like(head: bytes, size: int) -> str:
    """What a file that starts with ``head`` looks like, in a few words: a known format, text, or its first bytes."""
    for magic, kind in _KNOWN_FORMATS:
        if head.startswith(magic):
            return f"{size} bytes, {kind}"
    if len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < size:
        return f"{size} bytes, a safetensors file (load it with safetensors, not torch.load)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:  # (also a character cut at the end of the head: then shown as bytes)
        text = ""
    if text and all(c.isprintable() or c in "\n\r\t" for c in text):
        return f"{size} bytes of text starting {text[:40]!r}"
    return f"{size} bytes starting {head[:16]!r}"
