"""Checkpoint files we can trust: loaded without running pickled code, written whole or not at all, and
refused with a message that names the cause when they do not fit the model."""
from .errors import (
    CheckpointError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    NotACheckpointError,
    UnsafeCheckpointError,
)
from .integrity import atomic_copy, unreadable_reason
from .resume import newest_intact_checkpoint, trained_updates
from .safe_loading import TRUST_VARIABLE, safe_torch_load, trusted_by_user

__all__ = [
    "CheckpointError", "CorruptCheckpointError", "IncompatibleCheckpointError", "NotACheckpointError", "TRUST_VARIABLE",
    "UnsafeCheckpointError",
    "atomic_copy", "newest_intact_checkpoint", "safe_torch_load", "trained_updates", "trusted_by_user",
    "unreadable_reason",
]
