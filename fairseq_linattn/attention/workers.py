"""Checks that state every distributed worker draws for itself is the same on all of them."""
import hashlib
import logging

import torch
import torch.distributed as dist
from torch import Tensor

logger = logging.getLogger(__name__)


class WorkersDisagreeError(RuntimeError):
    pass


def check_same_on_every_worker(tensor: Tensor, what: str):
    """Raise on every worker if ``tensor`` is not bit-identical on all of them (one all_gather of a digest).

    Data-parallel training averages gradients of one model: a random draw (FAVOR+ features) that differed
    between workers would silently train a different model on each. Call it at the same point on every worker."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    data = tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    digest = int.from_bytes(hashlib.sha256(data).digest()[:8], "little", signed=True)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor([digest], dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    differing = [rank for rank, theirs in enumerate(everyone) if int(theirs) != digest]
    if differing:
        raise WorkersDisagreeError(
            f"{what} differ between distributed workers (rank {dist.get_rank()} disagrees with ranks {differing}): "
            "every worker must run the same code, torch version and options (e.g. --favor-seed)"
        )
    logger.info(f"{what}: identical on all {dist.get_world_size()} workers")
