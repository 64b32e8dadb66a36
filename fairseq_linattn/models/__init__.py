"""fairseq models with linear-complexity attention; importing this module registers them."""
from . import linformer_roberta  # noqa: F401
