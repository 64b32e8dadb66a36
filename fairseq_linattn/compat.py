"""The few fixes to fairseq 0.12 (``fairseq-fixed==0.12.3.1``) that this plugin owns.

Each fix is applied once, when the plugin is imported (``--user-dir`` imports it before fairseq loads any
checkpoint or starts any worker), is narrow, and names the fairseq trap it closes. See the README's
troubleshooting section.
"""
import logging
import os
import random
import types

import numpy
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


class _Numpy2CompatNumpy(types.ModuleType):
    """Stands in for ``numpy`` in the two fairseq data modules that still spell ``np.compat.long`` (removed in
    numpy 2): LM datasets with ``--sample-break-mode eos`` (fairseq-generate on a language model) and
    language-pair datasets would fail with AttributeError. ``np.compat.long`` was ``int`` (int64 here)."""

    compat = types.SimpleNamespace(long=int)

    def __getattr__(self, name):
        return getattr(numpy, name)


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


def _ddp_accepting_cpu_modules():
    """fairseq always passes ``device_ids=[device_id]`` to DistributedDataParallel, which torch rejects for a
    CPU module (gloo training with ``--cpu``). For CPU modules the ids are dropped, as torch asks."""
    from torch.nn.parallel import DistributedDataParallel

    class CpuFriendlyDistributedDataParallel(DistributedDataParallel):
        def __init__(self, module, device_ids=None, output_device=None, **kwargs):
            if all(p.device.type == "cpu" for p in module.parameters()):
                device_ids = output_device = None
            super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)

    return CpuFriendlyDistributedDataParallel


def _call_main_spawning_cpu_workers(original):
    """``--cpu --distributed-world-size N`` without torchrun: fairseq spawns ``min(cuda devices, N)`` workers,
    i.e. none on a CPU-only machine, and returns having trained nothing. Spawn N CPU workers instead, through
    fairseq's own ``distributed_main`` (each worker imports ``--user-dir`` again before building the model)."""

    def call_main(cfg, main, **kwargs):
        from fairseq.distributed import utils as distributed_utils

        dist = cfg.distributed_training
        launched_by_torchrun = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"))
        if (
            torch.cuda.is_available()
            or not cfg.common.cpu
            or dist.distributed_world_size <= 1
            or dist.distributed_init_method is not None
            or dist.distributed_no_spawn
            or launched_by_torchrun
        ):
            return original(cfg, main, **kwargs)
        port = dist.distributed_port if dist.distributed_port > 0 else random.randint(10000, 20000)
        dist.distributed_init_method = f"tcp://localhost:{port}"
        kwargs["start_rank"] = dist.distributed_rank or 0
        dist.distributed_rank = None  # assigned per worker by distributed_main
        torch.multiprocessing.spawn(
            fn=distributed_utils.distributed_main,
            args=(main, cfg, kwargs),
            nprocs=dist.distributed_world_size,
            join=True,
        )

    call_main.__wrapped__ = original
    return call_main


def apply_fairseq_fixes():
    global _APPLIED
    if _APPLIED:
        return
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils
    from fairseq.models import distributed_fairseq_model

    if checkpoint_utils.torch is torch:
        checkpoint_utils.torch = _TrustedCheckpointTorch("torch")
    distributed_utils._infer_torch_distributed_launch_init = _torchrun_init_without_cuda(
        distributed_utils._infer_torch_distributed_launch_init
    )
    if not hasattr(numpy, "compat"):
        from fairseq.data import language_pair_dataset, token_block_dataset

        for module in (token_block_dataset, language_pair_dataset):
            module.np = _Numpy2CompatNumpy("numpy")
    distributed_fairseq_model.DistributedDataParallel = _ddp_accepting_cpu_modules()
    distributed_utils.call_main = _call_main_spawning_cpu_workers(distributed_utils.call_main)
    _APPLIED = True
