"""The autotuning modes of the GPU runs (scripts/linattn_benchmarks/autotune.py) on Triton's ``Autotuner`` where
Triton is installed, and on a stand-in that keeps its contract (``run`` prunes, times each configuration with
``_bench``, keeps the fastest, and skips timing when one configuration is left) where it is not: which
configurations each mode compiles, that a failing one is passed over, that a limited search stores nothing on disk
and that the previous mode comes back."""
import functools
import math
import sys
import types

import pytest
from linattn_benchmarks import autotune


class OutOfResources(Exception):
    pass


class StandIn:
    """Triton's Autotuner as the patch sees it (triton/runtime/autotuner.py, 3.6)."""

    def __init__(self, fn, configs, cache_results=True):
        self.fn, self.configs, self.cache, self.cache_results = fn, configs, {}, cache_results
        self.disk = {}

    @functools.cached_property
    def do_bench(self):
        return lambda call, quantiles: (call(), [1.0, 1.0, 1.0])[1]

    def _bench(self, *args, config, **meta):
        try:
            return self.do_bench(lambda: self.fn.run(*args, **config), quantiles=(0.5, 0.2, 0.8))
        except OutOfResources:
            return [math.inf] * 3

    def prune_configs(self, kwargs):
        return self.configs

    def run(self, *args, **kwargs):
        key = args
        if key not in self.cache:
            pruned = self.prune_configs(kwargs)
            if len(pruned) == 1:
                self.cache[key] = pruned[0]
            else:
                timings = {i: self._bench(*args, config=c) for i, c in enumerate(pruned)}
                self.cache[key] = pruned[min(timings, key=timings.get)]
                if self.cache_results:
                    self.disk[key] = timings
        return self.fn.run(*args, **self.cache[key])


class Kernel:
    """Records the configurations it ran with; ``failing`` ones raise as a kernel too large for the chip does."""

    def __init__(self, failing=()):
        self.ran, self.failing = [], set(failing)

    def run(self, *args, B):
        if B in self.failing:
            raise OutOfResources(B)
        self.ran.append(B)


def stand_in(kernel):
    return StandIn(kernel, [{"B": b} for b in range(7)])


def triton_autotuner(kernel):
    triton = pytest.importorskip("triton", reason="Triton is not installed (the GPU machine has it)")
    from triton.runtime.autotuner import Autotuner, Config
    from triton.runtime.errors import OutOfResources as TritonOutOfResources

    class Fn:
        arg_names = ["x"]
        fn = staticmethod(lambda x: None)

        @staticmethod
        def run(*args, B, **_):
            if B in kernel.failing:
                raise TritonOutOfResources(1, 0, "shared memory")
            kernel.ran.append(B)

    assert triton
    return Autotuner(Fn(), ["x"], [Config({"B": b}) for b in range(7)], ["x"], None, None,
                     do_bench=lambda call, quantiles: (call(), [1.0, 1.0, 1.0])[1])  # (its disk cache needs a GPU)


TUNERS = {"stand-in": (stand_in, StandIn), "triton": (triton_autotuner, None)}


def tuner_class(name):
    if name == "triton":
        from triton.runtime.autotuner import Autotuner
        return Autotuner
    return StandIn


@pytest.mark.parametrize("which", TUNERS)
def test_first_runs_the_first_configuration_that_works_and_times_no_other(which):
    kernel = Kernel(failing={0})
    tuner = TUNERS[which][0](kernel)
    with autotune.mode("first", tuner_class(which)):
        tuner.run(5)
        assert kernel.ran == [1, 1]  # timed once (1 fails over to it), then run; 2..6 never compiled
        assert not getattr(tuner, "disk", {})
    assert tuner.cache == {}  # forgotten on leaving the mode


@pytest.mark.parametrize("which", TUNERS)
def test_shards_share_out_every_configuration_with_the_first_as_fallback(which):
    compiled = set()
    for shard in range(3):
        kernel = Kernel(failing={0})
        tuner = TUNERS[which][0](kernel)
        with autotune.mode(f"{shard}/3", tuner_class(which)):
            tuner.run(5)
        compiled |= set(kernel.ran)
        assert set(kernel.ran) <= {0, shard, shard + 3, shard + 6}
    assert compiled == set(range(1, 7))  # every configuration that compiles, once among the shards


@pytest.mark.parametrize("which", TUNERS)
def test_full_search_after_a_limited_one_stores_its_result_again(which):
    kernel = Kernel()
    tuner = TUNERS[which][0](kernel)
    stores = tuner.cache_results
    with autotune.mode("first", tuner_class(which)):
        tuner.run(5)
        assert not tuner.cache_results
    with autotune.mode("full", tuner_class(which)):
        kernel.ran.clear()
        tuner.run(5)
        assert kernel.ran == [*range(7), 0]  # every configuration timed, the fastest (a tie: the first) run
        assert tuner.cache_results == stores
    if which == "stand-in":
        assert (5,) in tuner.disk


def test_quick_times_each_configuration_for_5_plus_20_ms_and_full_as_before(monkeypatch):
    calls = []
    testing = types.SimpleNamespace(do_bench=lambda call, warmup, rep, quantiles: calls.append((warmup, rep)) or [2.0])
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(testing=testing))
    monkeypatch.setitem(sys.modules, "triton.testing", testing)
    tuner = StandIn(Kernel(), [{"B": 0}, {"B": 1}])
    with autotune.mode("quick", StandIn):
        tuner.run(5)
    assert calls == [(5, 20), (5, 20)]
    with autotune.mode("full", StandIn):
        assert tuner.do_bench(lambda: None, quantiles=None) == [1.0, 1.0, 1.0]  # the class's own timer


@pytest.mark.parametrize("mode", ["2", "3/3", "-1/2", "a/b", "fast"])
def test_a_mode_that_is_none_of_them_is_refused(mode):
    with pytest.raises(ValueError, match="expected full, quick, first or I/N"):
        autotune.parse(mode)
