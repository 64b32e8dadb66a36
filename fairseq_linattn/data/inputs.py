"""What the data scripts check before they write anything, and the error a user's mistake raises.

A mistake in what the user gave a data script (an input file that is missing or holds no text, a folder that
does not exist, a vocabulary the text cannot fill) is an :class:`InputError` whose message names the input and
what to do. The scripts' ``main`` turns it into argparse's one line (``<script>: error: <message>``, exit 2);
anything else keeps its traceback (a bug, or fairseq-preprocess failing). The checks run before the first
file is written, so that a mistake costs no waiting and leaves nothing behind (:mod:`.output_folder` covers
what can only fail later).
"""
from __future__ import annotations

from pathlib import Path


class InputError(ValueError):
    """A mistake in a data script's input: the message names the input and the fix."""


class MissingInputError(InputError, FileNotFoundError):
    """An input file or folder that does not exist (a FileNotFoundError too, for callers that catch that)."""


def check_text_file(path: str | Path, what: str, fix: str) -> Path:
    """``path`` if it is a file with at least one line that is not blank; else an :class:`InputError` naming
    ``what`` it is and the ``fix``. Reads up to the first such line only."""
    path = Path(path)
    if not path.is_file():
        kind = "a folder, not a file" if path.is_dir() else "not found"
        raise MissingInputError(f"{what} {path} is {kind}: {fix}")
    if not has_text_line(path):
        # sentencepiece would end with "INTERNAL: ... [!sentences_.empty()]", fairseq-preprocess with an empty split
        raise InputError(f"{path} is empty (or has no text lines): {fix}")
    return path


def has_text_line(path: str | Path) -> bool:
    """Whether the file has a line with something other than whitespace (read as bytes: any encoding)."""
    with open(path, "rb") as f:
        return any(line.strip() for line in f)


def check_existing(path: str | Path | None, option: str, what: str) -> None:
    """An :class:`InputError` if ``path`` (given with ``option``; None: not given) is not an existing file."""
    if path is None or Path(path).is_file():
        return
    state = "is a folder" if Path(path).is_dir() else "does not exist"
    raise MissingInputError(f"{option} {path} {state}: pass {what}")
