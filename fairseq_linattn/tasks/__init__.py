"""fairseq tasks of the plugin; importing this module registers them."""
from . import associative_recall, needle_retrieval  # noqa: F401
