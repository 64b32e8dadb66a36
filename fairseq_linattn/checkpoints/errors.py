"""What can be wrong with a checkpoint file, as exceptions whose message names the file, the cause and the fix."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used as it is."""


class CorruptCheckpointError(CheckpointError):
    """Empty, truncated or otherwise unreadable: most often a write cut off by a kill or a full disk."""


class NotACheckpointError(CorruptCheckpointError):
    """A file of another kind (not a zip archive or pickle that torch.save wrote): a wrong path, not a cut-off write.
    (A CorruptCheckpointError too, for callers that catch that: neither can be loaded.)"""


class UnsafeCheckpointError(CheckpointError):
    """The file pickles Python objects that no fairseq checkpoint holds; unpickling them could run code."""


class IncompatibleCheckpointError(CheckpointError, ValueError):
    """A readable checkpoint of another model: other sizes, dictionary, feature map, heads..."""
