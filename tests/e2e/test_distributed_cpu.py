"""Several CPU workers (gloo): fairseq's spawn and torchrun agree (two workers against one with --update-freq 2:
test_two_workers.py), two "nodes" of torchrun train and checkpoint, a dead worker or a dead parent stops the run
in bounded time (and it resumes), and FSDP's per-layer wrapping matches fairseq's own models."""
import os
import re
import sys
import time

import pytest
import torch

from tests.models.builders import SMALL_DECODER, SMALL_ENCODER, build

from .cli import COMMON, MODELS, TINY, USER_DIR, run
from .processes import Background, alive, spawned_workers, wait_gone

FAIRSEQ_TRAIN = os.path.join(os.path.dirname(sys.executable), "fairseq-train")
GLOO = ["--distributed-backend", "gloo"]
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0"]
STOPPED_WITHIN_S = 15  # a dead worker ends the run (the others stopped, the parent exited) within this


def train_two_workers(data, save_dir, launcher):
    args = [data, "--user-dir", USER_DIR, "--task", "masked_lm", "--criterion", "masked_lm", "--arch",
            "linformer_roberta_base", *TINY, "--tokens-per-sample", "64", "--batch-size", "8", "--optimizer",
            "adam", "--lr", "1e-3", "--max-update", "3", "--save-dir", save_dir, *GLOO,
            "--distributed-world-size", "2", *COMMON]
    if launcher == "torchrun":
        log = run("torchrun", "--nproc_per_node", "2", "--master_port", "29611", FAIRSEQ_TRAIN, *args)
    else:
        log = run("fairseq-train", *args)
    assert "training on 2 devices" in log, log[-3000:]
    assert re.search(r"valid on 'valid' subset .*\| bsz 16 \| num_updates 3", log), log[-3000:]
    return float(re.findall(r"valid on 'valid' subset \| loss ([0-9.]+)", log)[-1])


def test_spawned_and_torchrun_workers_agree(mlm_data, tmp_path):
    spawned = train_two_workers(mlm_data, tmp_path / "spawn", "spawn")
    launched = train_two_workers(mlm_data, tmp_path / "torchrun", "torchrun")
    assert spawned == launched


def model_args(data, model, save_dir, updates, *extra):
    return [data, "--user-dir", USER_DIR, *MODELS[model], "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-3",
            "--max-update", str(updates), "--no-epoch-checkpoints", "--save-dir", save_dir, *NO_DROPOUT, *COMMON, *extra]


def test_two_nodes_of_torchrun_train_checkpoint_and_resume(mlm_data, tmp_path):
    """torchrun --nnodes 2 --nproc_per_node 2 --node_rank {0,1} with the rendezvous on 127.0.0.1: four
    workers on two "nodes". The checkpoint validates, and two spawned workers resume from it (rank 0 reads
    it and broadcasts it to the others, which torch >= 2.6 refused before the plugin's safe loader)."""
    save = tmp_path / "ckpt"
    args = model_args(mlm_data, "lm-elu", save, 3, *GLOO, "--distributed-world-size", "4")
    nodes = [Background("torchrun", "--nnodes", "2", "--nproc_per_node", "2", "--node_rank", str(rank),
                        "--master_addr", "127.0.0.1", "--master_port", "29633", FAIRSEQ_TRAIN, *args,
                        log=tmp_path / f"node{rank}.log") for rank in (0, 1)]
    assert [node.wait(timeout=240) for node in nodes] == [0, 0], nodes[0].excerpt(3000) + nodes[1].excerpt(3000)
    log = nodes[0].log()
    assert "training on 4 devices" in log and "bsz 32 | num_updates 3" in log
    run("fairseq-validate", mlm_data, "--user-dir", USER_DIR, "--task", "language_modeling", "--path",
        save / "checkpoint_last.pt", "--tokens-per-sample", "64", "--cpu", "--batch-size", "8")
    resumed = run("fairseq-train", *model_args(mlm_data, "lm-elu", save, 5, *GLOO, "--distributed-world-size", "2"))
    assert "Loaded checkpoint" in resumed and "@ 3 updates" in resumed and "num_updates 5" in resumed


def long_run(data, save_dir, log):
    return Background("fairseq-train", *model_args(data, "lm-elu", save_dir, 100_000, "--save-interval-updates", "5"),
                      *GLOO, "--distributed-world-size", "2", log=log)


def test_a_dead_worker_stops_the_run_with_a_message_and_it_resumes(mlm_data, tmp_path):
    save = tmp_path / "ckpt"
    started = long_run(mlm_data, save, tmp_path / "killed.log")
    started.wait_until(lambda: (save / "checkpoint_last.pt").exists() and "num_updates=7," in started.log(),
                       cpu_s=180, what="a checkpoint and two more updates")
    workers = spawned_workers(started.pid)
    assert len(workers) == 2
    killed = time.monotonic()
    os.kill(workers[1], 9)  # as the OOM killer would
    assert started.wait(timeout=60) != 0
    assert time.monotonic() - killed < STOPPED_WITHIN_S  # docs/reliability.md says so
    assert "distributed worker 1 died (killed by SIGKILL); the other workers were stopped" in started.log()
    assert f"Run the same command again to resume from {save}/checkpoint_last.pt" in started.log()
    assert not any(alive(pid) for pid in workers)
    log = run("fairseq-train", *model_args(mlm_data, "lm-elu", save, 12, "--save-interval-updates", "5"), *GLOO,
              "--distributed-world-size", "2")
    assert re.search(r"Loaded checkpoint \S+ \(epoch 1 @ (5|10) updates\)", log) and "num_updates 12" in log


def test_killing_the_parent_stops_its_workers(mlm_data, tmp_path):
    """Before, a kill -9 of fairseq-train left both spawned workers training (and writing checkpoints)."""
    started = long_run(mlm_data, tmp_path / "ckpt", tmp_path / "parent.log")
    started.wait_until(lambda: "num_updates=2," in started.log(), cpu_s=180, what="two updates")
    workers = spawned_workers(started.pid)
    assert len(workers) == 2
    started.kill()
    assert wait_gone(workers, timeout=30) < 30


def test_fsdp_on_cpu_stops_at_start_up_with_the_reason(mlm_data, tmp_path):
    log = run("fairseq-train", *model_args(mlm_data, "linformer", tmp_path, 2), *GLOO, "--distributed-world-size",
              "2", "--ddp-backend", "fully_sharded", check=False)
    assert "--ddp-backend fully_sharded needs CUDA: fairscale's FullyShardedDataParallel" in log
    assert "Torch not compiled with CUDA" not in log  # where fairscale itself stopped


FSDP_PROBE = """
import sys, tempfile, time, traceback
import torch, torch.distributed as dist, torch.multiprocessing as mp

def worker(rank, store, compute_device):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    from fairseq.distributed.fully_sharded_data_parallel import FullyShardedDataParallel
    try:  # fairseq's wrapper, with the process group as fairseq-train passes it
        kwargs = {"compute_device": torch.device(compute_device)} if compute_device else {}
        model = FullyShardedDataParallel(torch.nn.Linear(4, 4), process_group=dist.group.WORLD, **kwargs)
        model(torch.randn(2, 4)).sum().backward()
        print("TRAINED")
    except Exception as error:
        where = traceback.extract_tb(error.__traceback__)
        fairscale = [f.name for f in where if "fairscale" in f.filename]
        print(f"STOPPED rank {rank}: {type(error).__name__}: {str(error)[:80]} in {fairscale[-1]}", flush=True)
    finally:  # a rank that exits first tears down the gloo pairs the other may still be connecting (a new group):
        # both wait for both, through a file store that needs no gloo connection
        done = dist.FileStore(f"{store}.done", 2)
        done.add("finished", 1)
        deadline = time.monotonic() + 60
        while done.add("finished", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)

if __name__ == "__main__":  # forked workers (no import each); fairseq's default compute device, then the CPU
    import fairseq.distributed.fully_sharded_data_parallel  # noqa: F401
    for compute_device in (None, "cpu"):
        print(f"COMPUTE DEVICE {compute_device}", flush=True)
        mp.start_processes(worker, args=(tempfile.mktemp(), compute_device), nprocs=2, start_method="fork")
"""


def test_fairscale_fsdp_stops_on_cpu_where_the_docs_say(tmp_path):
    """Why the plugin refuses fully_sharded on CPU, shown with two gloo workers and fairscale itself: with
    fairseq's arguments, FSDP's constructor sends a tensor to CUDA to check the process group; given a CPU
    compute device, it wraps but its first forward looks for its CUDA streams."""
    pytest.importorskip("fairscale")
    (tmp_path / "probe.py").write_text(FSDP_PROBE)
    log = run(os.path.basename(sys.executable), tmp_path / "probe.py", timeout=120)
    default, cpu = log.split("COMPUTE DEVICE None", 1)[1].split("COMPUTE DEVICE cpu")
    assert default.count("in validate_process_group") == 2 and "TRAINED" not in log, log[-3000:]
    assert "Torch not compiled with CUDA enabled" in default
    assert cpu.count("KeyError: 'all_gather' in _rebuild_full_params") == 2, log[-3000:]


FSDP_MODELS = {
    "linformer_roberta_base": "roberta_base",
    "linear_roberta_base": "roberta_base",
    "linear_transformer_lm": "transformer_lm",
}


@pytest.mark.parametrize("ours", FSDP_MODELS)
@pytest.mark.parametrize("checkpoint_activations", [False, True])
def test_fsdp_wraps_our_layers_one_by_one_as_fairseq_wraps_its_own(ours, checkpoint_activations):
    """fairscale's FSDP needs CUDA to run (see above), but the wrapping is decided when the model is built:
    inside fairscale's enable_wrap, every layer goes through fairseq's fsdp_wrap, the same layers as in
    fairseq's own roberta / transformer_lm (a recording wrapper stands in for FullyShardedDataParallel)."""
    from fairscale.nn import enable_wrap

    class Recorded(torch.nn.Module):
        def __init__(self, module, **kwargs):
            super().__init__()
            self.module, self.kwargs = module, kwargs

    def wrapped(arch):
        sizes = SMALL_DECODER if "lm" in arch else SMALL_ENCODER
        with enable_wrap(wrapper_cls=Recorded, flatten_parameters=True):
            model, _ = build(arch, min_params_to_wrap=0, checkpoint_activations=checkpoint_activations, **sizes)
        return {name for name, module in model.named_modules() if isinstance(module, Recorded)}

    ours_wrapped, theirs_wrapped = wrapped(ours), wrapped(FSDP_MODELS[ours])
    assert ours_wrapped == theirs_wrapped and len(ours_wrapped) == 2 + ("lm" in ours)  # one per layer
