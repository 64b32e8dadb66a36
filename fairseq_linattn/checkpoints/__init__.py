"""Checkpoint files we can trust: loaded without running pickled code, written whole or not at all, and
refused with a message that names the cause when they do not fit the model."""
from .errors import CheckpointError, CorruptCheckpointError, IncompatibleCheckpointError, UnsafeCheckpointError
from .integrity import atomic_copy, unreadable_reason
from .resume import newest_intact_checkpoint, trained_updates
from .safe_loading import TRUST_VARIABLE, safe_torch_load, trusted_by_user
