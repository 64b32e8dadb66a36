"""Loading fairseq checkpoints with ``torch.load(weights_only=True)``: tensors and an allow-list of plain types.

A checkpoint is a pickle, and unpickling can call any function the file names: ``fairseq-validate --path
downloaded.pt`` could run arbitrary code. torch >= 2.6 refuses such files by default (``weights_only=True``),
but fairseq checkpoints also pickle their configuration (an ``argparse.Namespace`` in RoBERTa-style models and
older checkpoints, omegaconf containers in some, numpy scalars in meters), so fairseq 0.12's loader fails on
its own files. Instead of turning the protection off, we allow exactly the types fairseq stores. Everything on
the list is data: building one runs no code named by the file.

A file that pickles anything else is refused with :class:`UnsafeCheckpointError`. For a file you trust (an
old checkpoint that pickled other types), set ``FAIRSEQ_LINATTN_TRUST_CHECKPOINTS=1`` (torch's own
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` is honoured too): the file is then unpickled in full, with a warning.
"""
import argparse
import collections
import logging
import os
import pickle
import re
import typing
from typing import Any, List, Optional, Tuple, Union

import numpy
import torch

from .errors import CorruptCheckpointError, NotACheckpointError, UnsafeCheckpointError
from .integrity import NOT_A_CHECKPOINT, unreadable_reason

logger = logging.getLogger(__name__)

TRUST_VARIABLE = "FAIRSEQ_LINATTN_TRUST_CHECKPOINTS"
# what torch's zip reader says about an archive that is not whole or not a torch checkpoint
_ARCHIVE_ERRORS = ("PytorchStreamReader", "zip archive", "hasRecord", "archive is corrupted")
_TORCH_TRUST_VARIABLE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
_TRUE = ("1", "y", "yes", "true")


def trusted_by_user() -> bool:
    return any(os.environ.get(name, "").lower() in _TRUE for name in (TRUST_VARIABLE, _TORCH_TRUST_VARIABLE))


def _numpy_globals() -> List[Union[Any, Tuple[Any, str]]]:
    """numpy scalars, dtypes and arrays, under numpy 2's module names and numpy 1's (older files name
    ``numpy.core.multiarray``)."""
    multiarray = numpy._core.multiarray if hasattr(numpy, "_core") else numpy.core.multiarray
    found: List[Union[Any, Tuple[Any, str]]] = [numpy.dtype, numpy.ndarray]
    for name in ("scalar", "_reconstruct"):
        function = getattr(multiarray, name)
        found += [function, (function, f"numpy.core.multiarray.{name}")]
    dtypes = getattr(numpy, "dtypes", None)  # numpy >= 1.25 pickles dtypes by their class
    if dtypes is not None:
        found += [getattr(dtypes, name) for name in dir(dtypes) if name.endswith("DType")]
    return found


def _omegaconf_globals() -> List[Any]:
    """What an omegaconf DictConfig / ListConfig pickles: containers, their metadata and value nodes."""
    from omegaconf import DictConfig, ListConfig, nodes
    from omegaconf.base import ContainerMetadata, Metadata

    value_nodes = [getattr(nodes, name) for name in dir(nodes) if name.endswith("Node") and name != "ValueNode"]
    return [DictConfig, ListConfig, ContainerMetadata, Metadata, *value_nodes, typing.Any]


def allowed_globals() -> List[Union[Any, Tuple[Any, str]]]:
    """Every type a fairseq 0.x checkpoint pickles besides tensors and the builtins torch already allows."""
    return [
        argparse.Namespace,  # the config of RoBERTa-style models and of every pre-0.10 checkpoint
        collections.defaultdict,
        dict, list, int, float, str, bool, type(None),  # as type objects, inside omegaconf metadata
        *_omegaconf_globals(),
        *_numpy_globals(),
    ]


def safe_torch_load(f, *args, extra_globals=(), **kwargs):
    """``torch.load`` with ``weights_only=True`` and fairseq's allow-list (plus ``extra_globals``).

    Raises :class:`UnsafeCheckpointError` for a file that pickles anything else (unless the user trusts
    checkpoints, see the module doc), :class:`CorruptCheckpointError` for an empty or truncated file and
    :class:`NotACheckpointError` (one of those) for a file of another kind.
    """
    kwargs.pop("weights_only", None)
    name = getattr(f, "name", f)
    local = isinstance(name, str) and os.path.isfile(name)
    if local and (unreadable_reason(name) or "").startswith(NOT_A_CHECKPOINT):
        # before torch.load: on a file of another kind it fails with whatever its unpickler trips on (KeyError...)
        raise _unreadable(name, None)
    if trusted_by_user():
        logger.warning(f"loading {name} with weights_only=False ({TRUST_VARIABLE} / {_TORCH_TRUST_VARIABLE} is set): "
                       "the file may run code while it is unpickled")
        return torch.load(f, *args, weights_only=False, **kwargs)
    try:
        with torch.serialization.safe_globals([*allowed_globals(), *extra_globals]):
            return torch.load(f, *args, weights_only=True, **kwargs)
    except pickle.UnpicklingError as error:
        # torch reports every unpickling failure under weights_only as "Weights only load failed"; only one
        # that names a global the allow-list lacks, in a file that is whole, is a file asking to run code
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        whole = not local or unreadable_reason(name) is None
        if not (found and whole):
            raise _unreadable(name, error) from error
        raise UnsafeCheckpointError(
            f"refusing to load {name}: it pickles {found.group(1)}, which no fairseq checkpoint contains, and "
            f"unpickling it could run code from the file. If you trust this file (e.g. a checkpoint written by "
            f"other software), set {TRUST_VARIABLE}=1 to load it in full."
        ) from None
    except (EOFError, RuntimeError) as error:
        if isinstance(error, RuntimeError) and not any(sign in str(error) for sign in _ARCHIVE_ERRORS):
            raise  # e.g. a CUDA tensor without map_location: not the file's fault
        raise _unreadable(name, error) from error


def _unreadable(name, error: Optional[BaseException]) -> CorruptCheckpointError:
    """The error for a file torch cannot load (``error``: what torch.load raised): a file of another kind (a wrong
    path), or a damaged checkpoint."""
    reason = unreadable_reason(name) if isinstance(name, str) and os.path.isfile(name) else None
    if reason is not None and reason.startswith(NOT_A_CHECKPOINT):
        return NotACheckpointError(f"cannot load {name}: {reason}. Check that the path names a checkpoint that "
                                   "fairseq-train saved (checkpoint_best.pt, checkpoint_last.pt, ...).")
    reason = reason or f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no data'}"
    return CorruptCheckpointError(
        f"cannot load {name}: {reason}. It was most likely cut off while being written (a kill or a full disk). "
        "Use another checkpoint of the run; when fairseq-train resumes, it falls back to the newest intact "
        "checkpoint by itself."
    )
