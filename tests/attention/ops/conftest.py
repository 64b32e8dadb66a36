"""What the op tests share."""
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Every tensor of the op tests that use it (``pytestmark = pytest.mark.usefixtures("one_thread")``) is tiny:
    a second intra-op thread only adds synchronisation, and on a busy machine its spin-waits slow the many small
    ops of gradcheck down twentyfold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
