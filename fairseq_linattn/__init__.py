"""fairseq_linattn: linear-complexity self-attention for fairseq.

Import it (or pass ``--user-dir path/to/fairseq_linattn`` to any fairseq command) to register the models
(``linformer_roberta``, ``linear_transformer_lm``...), the ``associative_recall`` and ``needle_retrieval`` tasks, the
``associative_recall`` criterion, and to apply
the few fairseq fixes the plugin owns (see :mod:`fairseq_linattn.compat`).
"""
from .compat import apply_fairseq_fixes

apply_fairseq_fixes()

from . import criterions, models, tasks  # noqa: E402,F401  (registers the models, tasks and criterions with fairseq)

__version__ = "0.2.0"
