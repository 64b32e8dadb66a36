"""fairseq criterions of the plugin; importing this module registers them."""
from . import associative_recall, attention_transfer  # noqa: F401
