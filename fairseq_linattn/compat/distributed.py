"""fairseq's distributed launch, made to work on CPU machines and to fail cleanly.

* torchrun on a CPU-only machine: fairseq computes ``rank % torch.cuda.device_count()`` (division by zero).
* ``DistributedDataParallel`` with CPU modules: fairseq passes CUDA ``device_ids``, which torch rejects.
* ``--cpu --distributed-world-size N``: fairseq spawns one worker per CUDA device (none here) and returns
  having trained nothing. N CPU workers are spawned instead.
* Spawned workers die with their parent: a ``kill -9`` of ``fairseq-train`` no longer orphans its workers
  (they went on training, and writing checkpoints, with nobody watching).
* A worker that dies takes the run down with a message that says which and how to resume (torch's own
  spawn stops the others; its message only says "process 1 terminated with signal SIGKILL").
* ``--ddp-backend fully_sharded`` without CUDA stops at start-up with the reason: fairscale's FSDP needs CUDA.

Every command fairseq starts through ``call_main`` (and each worker it spawns) runs inside :func:`.scope.run`, which
tells the plugin's behaviour changes whether the run is one of our models'.
"""
import ctypes
import logging
import os
import random
import signal
import sys

import torch

from . import scope

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_original_distributed_main = None  # fairseq's, set by apply()


def torchrun_init_without_cuda(original):
    """With no CUDA device every torchrun worker uses the CPU (device 0); everything else as fairseq does."""

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


def ddp_accepting_cpu_modules():
    """For CPU modules the CUDA ``device_ids`` fairseq passes are dropped, as torch asks."""
    from torch.nn.parallel import DistributedDataParallel

    class CpuFriendlyDistributedDataParallel(DistributedDataParallel):
        def __init__(self, module, device_ids=None, output_device=None, **kwargs):
            if all(p.device.type == "cpu" for p in module.parameters()):
                device_ids = output_device = None
            super().__init__(module, device_ids=device_ids, output_device=output_device, **kwargs)

    return CpuFriendlyDistributedDataParallel


SPAWNED_BY = "_fairseq_linattn_spawned_by"  # a kwarg for distributed_main: the PID of the spawning process


def distributed_main_dying_with_parent(i, main, cfg, kwargs):
    """fairseq's ``distributed_main``; in a worker that ``torch.multiprocessing.spawn`` started for
    :func:`call_main_with_cpu_workers` or fairseq's GPU spawn (which name the spawning process in ``kwargs``), first
    ask the kernel to kill this worker when the spawning process dies (:func:`_die_with`), and once the work is done
    end the process without the interpreter's teardown (:func:`_exit_without_teardown`).

    Only spawned workers: a worker started by torchrun or slurm has a launcher that handles this, and one
    started by hand from a shell (``nohup fairseq-train --distributed-rank 3 ...``) must outlive the shell."""
    spawned_by = kwargs.pop(SPAWNED_BY, None)
    spawned = spawned_by is not None and spawned_by != os.getpid()
    if spawned:
        _die_with(spawned_by, i)
    with scope.run(cfg):
        result = _original_distributed_main(i, main, cfg, kwargs)
    _destroy_process_group()
    if spawned:
        _exit_without_teardown()
    return result


def _die_with(spawned_by: int, i: int):
    """Linux ``PR_SET_PDEATHSIG``: the kernel kills this worker when the process that spawned it dies."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != spawned_by:  # the parent died before the request took effect
        logger.error(f"worker {i}: the process that spawned it ({spawned_by}) is gone; exiting")
        os._exit(1)


def _exit_without_teardown():
    """End a spawned worker whose work is done (checkpoints written, asynchronous writes awaited by fairseq's
    ``main``, process group destroyed) as a normal exit would, less the interpreter's teardown: the ``atexit``
    handlers run (wandb, tensorboard writers) and the logs are flushed, then ``os._exit(0)``.

    The teardown is where gloo has aborted workers (SIGABRT, "terminate called without an active exception"; see
    :func:`_destroy_process_group`), and the group can outlive ``destroy_process_group`` there: the reducer of
    ``DistributedDataParallel`` holds it. With the group destroyed and the exit barrier in place a worker of two
    was still lost to SIGABRT on CI (2026-12-07; its fault dump was cut from the log, so where it died is not known;
    a two-worker DDP script that destroys its group and exits normally did not abort in roughly 100 rounds beside
    others here). After this exit no teardown is left to abort in. Nothing a worker has to do remains at that
    point; the spawning process reads only the exit code."""
    import atexit

    atexit._run_exitfuncs()  # what a normal exit runs first; os._exit skips it
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader has gone
            pass
    os._exit(0)


EXIT_SYNC_TIMEOUT_S = 60.0  # how long a finished worker waits for the others to finish too


def _destroy_process_group():
    """Take the process group down before the interpreter exits, once every worker is out of the last barrier.

    fairseq's ``distributed_main`` ends with a barrier and leaves the group to the interpreter's teardown, where
    gloo's threads can still be running when their objects are destroyed: on a loaded machine a worker then dies
    by SIGABRT ("terminate called without an active exception") after training has finished, and the command
    fails. Two torchrun "nodes" of two gloo workers that all-reduce, barrier and exit aborted in 3 of 8 rounds
    beside two other such runs on a 2-core machine, and in none of 39 when the group was destroyed first. Yet the
    two-node test, which destroys it, once lost a worker to SIGABRT on CI after the others had finished: a worker
    that tears its connections down while another is still in the barrier can break the other's. So no worker
    starts tearing down before every worker is out of the barrier (:func:`_leave_together`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        _leave_together(dist)
        dist.destroy_process_group()


def _leave_together(dist, timeout_s: float = EXIT_SYNC_TIMEOUT_S):
    """Wait, through the rendezvous store (no gloo connection), until every rank has arrived here. Rank 0 may host
    that store (``tcp://`` and ``env://`` without torchrun's agent), so it returns last: after every other rank
    has told the store it is leaving. Training has finished: a failure here is logged, never raised."""
    import datetime

    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.distributed_c10d._get_default_store()
        rank, world = dist.get_rank(), dist.get_world_size()
        _count_and_wait(store, "fairseq_linattn/exit/arrived", world, timeout)
        if rank != 0:
            _count_and_wait(store, "fairseq_linattn/exit/leaving", world - 1, None)
        elif world > 1:
            store.wait(["fairseq_linattn/exit/leaving/all"], timeout)
    except Exception as error:  # noqa: BLE001 - the run's work is saved; its exit must not fail on this
        logger.warning(f"worker {dist.get_rank()} left without waiting for the others to finish: {error}")


def _count_and_wait(store, key: str, count: int, timeout):
    """Add this rank to ``key``'s count; the rank that completes it sets ``key/all``, which every rank that passes
    a ``timeout`` then waits for (``None``: only count)."""
    if store.add(key, 1) == count:
        store.set(f"{key}/all", "1")
    if timeout is not None:
        store.wait([f"{key}/all"], timeout)


def call_main_with_cpu_workers(original):
    """fairseq's ``call_main``, which starts every training command. ``--cpu --distributed-world-size N``
    without a launcher (torchrun, slurm) spawns N CPU workers through fairseq's ``distributed_main``; other
    runs go as fairseq makes them. Either way a dead worker gives a message that says how to go on."""

    def call_main(cfg, main, **kwargs):
        with scope.run(cfg):
            return _call_main(cfg, main, **kwargs)

    def _call_main(cfg, main, **kwargs):
        from fairseq.distributed import utils as distributed_utils
        from torch.multiprocessing import ProcessExitedException

        dist = cfg.distributed_training
        if dist.ddp_backend == "fully_sharded" and (cfg.common.cpu or not torch.cuda.is_available()):
            raise ValueError(
                "--ddp-backend fully_sharded needs CUDA: fairscale's FullyShardedDataParallel moves a tensor to "
                "the GPU to check its process group and gathers the shards on CUDA streams (given a CPU device, its "
                "first forward stops there). On CPU use --ddp-backend pytorch_ddp (the default) or no_c10d."
            )
        _bf16_without_tpu(cfg)
        try:
            if not _spawns_cpu_workers(cfg):
                if dist.distributed_init_method is None:
                    distributed_utils.infer_init_method(dist)  # as fairseq's call_main does first (idempotent)
                if dist.distributed_init_method is not None and not dist.distributed_no_spawn:
                    kwargs[SPAWNED_BY] = os.getpid()  # fairseq spawns one worker per GPU
                return original(cfg, main, **kwargs)
            kwargs[SPAWNED_BY] = os.getpid()
            port = dist.distributed_port if dist.distributed_port > 0 else random.randint(10000, 20000)
            dist.distributed_init_method = f"tcp://localhost:{port}"
            kwargs["start_rank"] = dist.distributed_rank or 0
            dist.distributed_rank = None  # assigned per worker by distributed_main
            torch.multiprocessing.spawn(fn=distributed_main_dying_with_parent, args=(main, cfg, kwargs),
                                        nprocs=dist.distributed_world_size, join=True)
        except ProcessExitedException as error:
            how = f"killed by {error.signal_name}" if error.signal_name else f"exit code {error.exit_code}"
            raise RuntimeError(
                f"distributed worker {error.error_index} died ({how}); the other workers were stopped. Run the "
                f"same command again to resume from {cfg.checkpoint.save_dir}/checkpoint_last.pt."
            ) from error

    call_main.__wrapped__ = original
    return call_main


def _bf16_without_tpu(cfg):
    """fairseq 0.12's command line turns ``--bf16`` into ``--tpu`` as well, so ``fairseq-train --bf16`` dies on
    any machine without torch_xla ('NoneType' object has no attribute 'xla_device'), GPUs included. Without
    torch_xla, bf16 runs where the other options say (CUDA or ``--cpu``), as under fairseq-hydra-train."""
    if not (cfg.common.bf16 and cfg.common.tpu):
        return
    try:
        import torch_xla  # noqa: F401
        return
    except ImportError:
        pass
    logger.info("--bf16 without torch_xla: training in bfloat16 on %s, not on a TPU", "CPU" if cfg.common.cpu else "CUDA")
    for group in cfg.values():
        if hasattr(group, "keys") and "tpu" in group:
            group.tpu = False


def _spawns_cpu_workers(cfg) -> bool:
    """fairseq would spawn one worker per CUDA device, i.e. none: a CPU run with several workers and no
    launcher that made them (torchrun sets MASTER_ADDR..., slurm its node list)."""
    dist = cfg.distributed_training
    launched = all(k in os.environ for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")) or any(
        k in os.environ for k in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
    )
    return (
        (cfg.common.cpu or not torch.cuda.is_available())
        and dist.distributed_world_size > 1
        and dist.distributed_init_method is None
        and not dist.distributed_no_spawn
        and not launched
    )


def apply():
    global _original_distributed_main
    from fairseq.distributed import utils as distributed_utils
    from fairseq.models import distributed_fairseq_model

    distributed_utils._infer_torch_distributed_launch_init = torchrun_init_without_cuda(
        distributed_utils._infer_torch_distributed_launch_init
    )
    distributed_fairseq_model.DistributedDataParallel = ddp_accepting_cpu_modules()
    _original_distributed_main = distributed_utils.distributed_main
    distributed_utils.distributed_main = distributed_main_dying_with_parent  # what fairseq's GPU spawn runs too
    distributed_utils.call_main = call_main_with_cpu_workers(distributed_utils.call_main)
