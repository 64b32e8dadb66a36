"""fla-core's autotuning inside a device lease: three ways to spend less of it compiling and timing.

fla-core autotunes each Triton kernel over up to 48 configurations (block sizes x warps x stages); Triton compiles
them one after another on one core and times each for 125 ms. A fresh machine pays that again for every kernel,
dtype and shape key: two 15-minute leases (four calls) went mostly to it (results/gpu_cuda_tests.md). Each mode
below patches Triton's ``Autotuner`` in this process only:

* ``first``: each kernel runs its first configuration that compiles and runs, timing none. The CUDA tests: a
  kernel must be right under any configuration it accepts, and the test compiles one per kernel;
* ``I/N`` (shard I of N): each kernel is tuned among every N-th configuration from the I-th (and the first, a
  fallback). N processes running one workload compile every configuration once, in parallel, into Triton's on-disk
  cache, so that a full search afterwards only times them (scripts/gpu_warm_kernels.py);
* ``quick``: the full search, each configuration timed for 5 + 20 ms instead of Triton's 25 + 100 (the benchmarks);
* ``full``: Triton's own.

A limited search (``first``, a shard) never stores its choice in Triton's on-disk autotuning cache, where a full
search would read it as its own.
"""
import contextlib
import math
import weakref
from typing import Callable, List, NamedTuple, Optional

MODES = "full, quick, first or I/N (shard I of N)"
BENCHMARK_MODES = ("first", "quick", "full")  # what a benchmark may run under (bench_gpu.py --autotune)
QUICK_WARMUP_MS, QUICK_REP_MS = 5, 20


class Policy(NamedTuple):
    select: Optional[Callable[[List], List]]  # the configurations searched; None: every one
    first: bool  # time configurations only until one runs
    quick: bool  # time each for QUICK_WARMUP_MS + QUICK_REP_MS


_mode, _policy = "full", Policy(None, False, False)
_seen: "weakref.WeakSet" = weakref.WeakSet()  # autotuners that searched under a mode: reset() forgets their choices


def parse(mode: str) -> Policy:
    """The policy of ``mode``; ValueError names the modes."""
    mode = mode.strip().lower()
    if mode in ("full", "quick"):
        return Policy(None, False, mode == "quick")
    if mode == "first":
        return Policy(None, True, False)
    shard, _, shards = mode.partition("/")
    try:
        i, n = int(shard), int(shards)
    except ValueError:
        i = n = -1
    if not 0 <= i < n:
        raise ValueError(f"autotuning mode {mode!r}: expected {MODES}")
    return Policy(lambda configs: configs[i::n] if i == 0 else [configs[0], *configs[i::n]], False, False)


def set_mode(mode: str, autotuner_class=None) -> None:
    """Autotune by ``mode`` from now on in this process (patching ``autotuner_class``, Triton's by default, once)."""
    global _mode, _policy
    _mode, _policy = mode.strip().lower(), parse(mode)
    if autotuner_class is None:
        from triton.runtime.autotuner import Autotuner as autotuner_class
    if not getattr(autotuner_class, "_linattn_patched", False):
        _patch(autotuner_class)


@contextlib.contextmanager
def mode(name: str, autotuner_class=None):
    """Autotune by ``name`` within the block, then as before (the configurations chosen inside are forgotten)."""
    previous = _mode
    set_mode(name, autotuner_class)
    try:
        yield
    finally:
        reset()
        set_mode(previous, autotuner_class)


def reset() -> None:
    """Forget the configurations chosen so far under any mode (before a search under another)."""
    for tuner in list(_seen):
        tuner.cache.clear()


def _patch(cls) -> None:
    prune, bench = cls.prune_configs, cls._bench
    triton_do_bench = cls.__dict__.get("do_bench")

    def prune_configs(self, kwargs):
        configs = prune(self, kwargs)
        _seen.add(self)
        if not hasattr(self, "_linattn_cache_results"):
            self._linattn_cache_results = self.cache_results
        limited = _policy.first or _policy.select is not None
        self.cache_results = self._linattn_cache_results and not limited  # read by run() after this call
        self._linattn_found = False
        return configs if _policy.select is None else _policy.select(configs)

    def _bench(self, *args, config, **meta):
        if _policy.first and self._linattn_found:
            return [math.inf] * 3
        timing = bench(self, *args, config=config, **meta)
        if min(timing if isinstance(timing, (list, tuple)) else [timing]) < math.inf:
            self._linattn_found = True
        return timing

    def do_bench(self):
        if _policy.quick:
            import triton.testing

            return lambda kernel_call, quantiles: triton.testing.do_bench(
                kernel_call, warmup=QUICK_WARMUP_MS, rep=QUICK_REP_MS, quantiles=quantiles)
        return triton_do_bench.func(self)  # Triton's cached_property, uncached

    cls.prune_configs, cls._bench = prune_configs, _bench
    if triton_do_bench is not None:
        cls.do_bench = property(do_bench)
    cls._linattn_patched = True
