"""fairseq models with linear-complexity attention; importing this module registers them."""
from . import linear_roberta, linear_transformer, linear_transformer_lm, linformer_roberta  # noqa: F401
