import pytest
import torch

import fairseq_linattn  # noqa: F401  (registers the models, applies the fairseq fixes)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
