"""fairseq's distributed entry point, as the plugin patches it: a worker takes its process group down before it
returns (a gloo group left to the interpreter's teardown aborted a worker now and then on a loaded machine)."""
import logging
import socket
import threading
import time

import torch.distributed as dist
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils

from fairseq_linattn.compat import distributed


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_worker_destroys_its_process_group_before_it_returns(tmp_path):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(tmp_path), "--cpu", "--arch", "transformer_lm", "--task",
                                                "language_modeling", "--distributed-backend", "gloo",
                                                "--distributed-world-size", "1", "--distributed-init-method",
                                                f"tcp://127.0.0.1:{free_port()}"])
    cfg = convert_namespace_to_omegaconf(args)
    seen = {}

    def main(cfg):
        seen["initialized"] = dist.is_initialized()
        seen["rank"] = dist.get_rank()

    assert distributed_utils.distributed_main is distributed.distributed_main_dying_with_parent  # patched
    distributed_utils.distributed_main(0, main, cfg, {})
    assert seen == {"initialized": True, "rank": 0}
    assert not dist.is_initialized()


class Rank:
    """What ``_leave_together`` reads of torch.distributed, for one rank of a group sharing ``store``."""

    def __init__(self, store, rank, world):
        self.distributed_c10d = type("c10d", (), {"_get_default_store": staticmethod(lambda: store)})
        self.get_rank, self.get_world_size = (lambda: rank), (lambda: world)


class SlowToLeave:
    """A rank's view of the store in which saying "leaving" takes a while, so rank 0 must wait for it."""

    def __init__(self, store):
        self.store = store

    def add(self, key, amount):
        if key.endswith("leaving"):
            time.sleep(0.3)
        return self.store.add(key, amount)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_no_rank_leaves_before_all_arrived_and_rank_0_leaves_last():
    """Rank 0 may host the store the others still use: it returns only once every other rank has said it leaves."""
    store, world, returned, late_arrival = dist.HashStore(), 3, {}, 0.3
    start = time.monotonic()

    def leave(rank):
        if rank == 2:
            time.sleep(late_arrival)
        distributed._leave_together(Rank(SlowToLeave(store) if rank == 1 else store, rank, world), timeout_s=10)
        returned[rank] = (time.monotonic() - start, store.add("fairseq_linattn/exit/leaving", 0))

    threads = [threading.Thread(target=leave, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert sorted(returned) == [0, 1, 2]
    assert min(seconds for seconds, _ in returned.values()) >= late_arrival
    assert returned[0][1] == world - 1


def test_a_rank_that_waits_in_vain_logs_and_returns(caplog):
    store = dist.HashStore()
    with caplog.at_level(logging.WARNING):
        distributed._leave_together(Rank(store, 1, 2), timeout_s=0.2)
    assert "worker 1 left without waiting for the others to finish" in caplog.text
