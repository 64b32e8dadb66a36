import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import fairseq_linattn  # noqa: E402,F401  (registers models, applies fixes)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
