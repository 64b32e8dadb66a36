"""The few fixes to fairseq 0.12 (``fairseq-fixed==0.12.3.1``) that this plugin owns.

Each fix is applied once, when the plugin is imported (``--user-dir`` imports it before fairseq loads any
checkpoint or starts any worker), is narrow, and names the fairseq trap it closes. See the README's
troubleshooting section.
"""
import logging
import os
import types

import torch

logger = logging.getLogger(__name__)

_APPLIED = False


class _TrustedCheckpointTorch(types.ModuleType):
    """Stands in for ``torch`` inside ``fairseq.checkpoint_utils``: ``load`` keeps the pre-2.6 default
    ``weights_only=False``; every other attribute is torch's own.

    Why: torch >= 2.6 defaults to ``weights_only=True``, and fairseq checkpoints pickle an
    ``argparse.Namespace`` / omegaconf config, so ``fairseq-validate``, ``fairseq-eval-lm``,
    ``--restore-file`` and ``from_pretrained`` fail with ``UnpicklingError``. fairseq upstream fixed this the
    same way (commit "Pt2.6 compatibility"). Only fairseq's checkpoint loader sees the change; every other
    ``torch.load`` in the process keeps torch's safe default. Like any pickle, load only checkpoints you trust.
    """

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(f, *args, **kwargs):
        kwargs.setdefault("weights_only", False)
        return torch.load(f, *args, **kwargs)


def _torchrun_init_without_cuda(original):
    """fairseq computes ``rank % torch.cuda.device_count()`` for torchrun workers, which divides by zero on
    a CPU-only machine. With no CUDA device every worker uses the CPU (device 0), everything else as before."""

    def infer(cfg):
        if torch.cuda.is_available():
            return original(cfg)
        cfg.distributed_init_method = "env://"
        cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
        cfg.distributed_rank = int(os.environ["RANK"])
        cfg.device_id = 0
        cfg.distributed_no_spawn = True  # torchrun already made the processes

    infer.__wrapped__ = original
    return infer


def apply_fairseq_fixes():
    global _APPLIED
    if _APPLIED:
        return
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    if checkpoint_utils.torch is torch:
        checkpoint_utils.torch = _TrustedCheckpointTorch("torch")
    distributed_utils._infer_torch_distributed_launch_init = _torchrun_init_without_cuda(
        distributed_utils._infer_torch_distributed_launch_init
    )
    _APPLIED = True
