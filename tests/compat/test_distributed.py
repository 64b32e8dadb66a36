"""fairseq's distributed entry point, as the plugin patches it: a worker takes its process group down before it
returns, and a spawned one then ends without the interpreter's teardown (where gloo aborted workers now and then
on a loaded machine)."""
import atexit
import logging
import os
import socket
import threading
import time

import pytest
import torch.distributed as dist
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.distributed import utils as distributed_utils

from fairseq_linattn.compat import distributed


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_worker_config(tmp_path):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(tmp_path), "--cpu", "--arch", "transformer_lm", "--task",
                                                "language_modeling", "--distributed-backend", "gloo",
                                                "--distributed-world-size", "1", "--distributed-init-method",
                                                f"tcp://127.0.0.1:{free_port()}"])
    return convert_namespace_to_omegaconf(args)


def test_a_worker_destroys_its_process_group_before_it_returns(tmp_path):
    cfg = one_worker_config(tmp_path)
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


def test_a_spawned_worker_ends_without_the_teardown_once_its_group_is_gone(tmp_path, monkeypatch):
    """A worker spawned by another process: it asks to die with its parent first, and when the work is done and the
    group destroyed, it ends without the interpreter's teardown (where gloo aborted workers). In-process (the
    spawning process runs rank 0 itself, fairseq with one GPU) neither happens."""
    calls = []
    monkeypatch.setattr(distributed, "_die_with", lambda pid, i: calls.append(("die_with", pid)))
    monkeypatch.setattr(distributed, "_exit_without_teardown",
                        lambda: calls.append(("exit", dist.is_initialized())))
    cfg = one_worker_config(tmp_path)
    distributed_utils.distributed_main(0, lambda cfg: calls.append(("main", dist.get_rank())), cfg,
                                       {distributed.SPAWNED_BY: 123456789})
    assert calls == [("die_with", 123456789), ("main", 0), ("exit", False)]

    calls.clear()
    cfg = one_worker_config(tmp_path)
    distributed_utils.distributed_main(0, lambda cfg: calls.append(("main", dist.get_rank())), cfg,
                                       {distributed.SPAWNED_BY: os.getpid()})
    assert calls == [("main", 0)] and not dist.is_initialized()


def test_the_exit_without_teardown_runs_the_exit_handlers_and_flushes_the_logs_first(monkeypatch):
    """The order of a normal exit's first steps, then os._exit(0). Every step is replaced by a recorder: the real
    atexit handlers of this test process (the suite's fork server among them) must not run here."""
    events = []

    class Exited(Exception):
        pass

    def fake_exit(code):
        events.append(("os._exit", code))
        raise Exited

    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: events.append("atexit handlers"))
    monkeypatch.setattr(logging, "shutdown", lambda: events.append("logs flushed"))
    monkeypatch.setattr(os, "_exit", fake_exit)
    with pytest.raises(Exited):
        distributed._exit_without_teardown()
    assert events == ["atexit handlers", "logs flushed", ("os._exit", 0)]
