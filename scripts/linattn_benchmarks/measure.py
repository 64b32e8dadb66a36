"""Measuring: time (cases interleaved, repeated), where it goes (torch.profiler), and peak memory (each case in a
fresh process forked from a server that has only imported torch, fairseq and the plugin, so that its
high-water mark starts low)."""
import multiprocessing as mp
import resource
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

MB = 1024.0 * 1024.0


def interleaved_times(
    fns: Dict[str, Callable[[], None]],
    warmup: int = 1,
    repeats: int = 5,
    budget_s: Optional[float] = None,
    min_repeats: int = 2,
    setup: Optional[Dict[str, Callable[[], None]]] = None,
) -> Dict[str, List[float]]:
    """Seconds per call of each function: ``warmup`` untimed rounds, then up to ``repeats`` timed rounds, the
    functions interleaved within each round (order rotated every round, so that no case always follows the
    same one). With ``budget_s``, a case whose warm-up took t seconds gets ``budget_s / t`` repeats (at least
    ``min_repeats``, at most ``repeats``). ``setup[name]``, if given, runs untimed before every call."""
    setup = setup or {}
    names = list(fns)
    estimate = {}
    for _ in range(max(1, warmup)):
        for name in names:
            if name in setup:
                setup[name]()
            t0 = time.perf_counter()
            fns[name]()
            estimate[name] = time.perf_counter() - t0
    count = {}
    for name in names:
        count[name] = repeats
        if budget_s is not None:
            count[name] = max(min_repeats, min(repeats, int(budget_s / max(estimate[name], 1e-9))))
    times = {name: [] for name in names}
    if warmup == 0:  # the estimate run was the only one: count it
        for name in names:
            times[name].append(estimate[name])
    for r in range(max(count.values())):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            if len(times[name]) >= count[name]:
                continue
            if name in setup:
                setup[name]()
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def profile_call(fn: Callable[[], object], rows: int = 12) -> Dict:
    """torch.profiler over one call of ``fn`` (after one untimed call): wall time and the top ops by self CPU
    time, grouped by input shapes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    events = prof.key_averages(group_by_input_shape=True)
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return {
        "wall_ms": wall * 1000,
        "self_cpu_total_ms": total / 1000,
        "top": [
            {"op": e.key, "shapes": str(e.input_shapes)[:90], "calls": e.count,
             "self_ms": e.self_cpu_time_total / 1000, "percent": 100.0 * e.self_cpu_time_total / max(total, 1)}
            for e in top
        ],
    }


def max_rss_bytes() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # Linux reports KiB


def peak_memory(build: Callable[[], object], run: Callable[[object], None]) -> Dict:
    """Run in a fresh process: ru_maxrss after ``build()`` (baseline) and after ``run(built)`` (peak)."""
    built = build()
    baseline = max_rss_bytes()
    run(built)
    peak = max_rss_bytes()
    return {"baseline_mb": baseline / MB, "peak_mb": peak / MB, "delta_mb": (peak - baseline) / MB}


_CONTEXT = None


def _context(preload: Sequence[str]):
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        # the server imports these once; each case is then a fork of a process that has run nothing
        _CONTEXT.set_forkserver_preload(["torch", "fairseq_linattn", *preload])
    return _CONTEXT


def _child(conn, threads, fn, args):
    try:
        torch.set_num_threads(threads)
        conn.send(("ok", fn(*args)))
    except BaseException as error:  # noqa: BLE001  (reported to the parent)
        conn.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        conn.close()


def isolated(fn: Callable, *args, threads: int = 2, timeout: float = 600.0) -> Dict:
    """``fn(*args)`` in a fresh process (see the module docstring); a dict with ``error`` if it failed or died
    (e.g. killed for memory). ``fn`` must be a module-level function (it is pickled by name)."""
    ctx = _context([fn.__module__])
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, threads, fn, args))
    proc.start()
    send.close()
    result = None
    if receive.poll(timeout):
        try:
            result = receive.recv()
        except EOFError:
            result = None
    proc.join(timeout=30)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if result is None:
        return {"error": f"process ended with code {proc.exitcode} (killed for memory or timed out)"}
    status, value = result
    return value if status == "ok" else {"error": value}
