"""Checkpoint files we can trust: loaded without running pickled code (safe_loading), written whole or not at
all (integrity), resumed from the newest intact one (resume), and refused with a message that names the cause
when they do not fit the model (fit), read as they were trained when an option changed meaning since
(upgrade). :mod:`fairseq_linattn.compat.checkpoints` wires these into fairseq."""
from .errors import (
    CheckpointError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    NotACheckpointError,
    UnsafeCheckpointError,
)
from .fit import check_same_attention
from .integrity import atomic_copy, unreadable_reason
from .resume import check_restore_file_exists, newest_intact_checkpoint, trained_updates
from .safe_loading import TRUST_VARIABLE, safe_torch_load, trusted_by_user
from .upgrade import upgrade_checkpoint_options

__all__ = [
    "CheckpointError", "CorruptCheckpointError", "IncompatibleCheckpointError", "NotACheckpointError", "TRUST_VARIABLE",
    "UnsafeCheckpointError", "atomic_copy", "check_restore_file_exists", "check_same_attention",
    "newest_intact_checkpoint", "safe_torch_load", "trained_updates", "trusted_by_user", "unreadable_reason",
    "upgrade_checkpoint_options",
]
