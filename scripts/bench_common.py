"""Shared plumbing of the benchmark scripts (bench_linformer.py, bench_lm_training.py, bench_decoding.py).

* models are built the way fairseq builds them, without data on disk
  (:func:`fairseq_linattn.models.standalone.build_model`, with a ``DictionaryTask``);
* attention swaps: :class:`ZeroAttention` (the attention-free ceiling), :class:`ProjectionsOnlyAttention`
  (the q/k/v/out projections without attention: the floor of any attention that has them) and the SDPA baseline
  (:class:`fairseq_linattn.attention.full.SoftmaxAttention` with fairseq's weights copied in);
* timing: warm-up, then cases interleaved round by round (rotating the order), median per case;
* peak memory: each case runs in a fresh process (forked from a forkserver that has only imported torch,
  fairseq and the plugin, so its high-water mark starts low) and reports ``ru_maxrss`` after building the
  model (baseline) and after running it (peak);
* the machine line (CPU model, cores, torch, threads, load averages) and the .md/.json/.png outputs.
"""
import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase  # noqa: E402
from torch import nn  # noqa: E402

import fairseq_linattn  # noqa: E402,F401  (registers the plugin's models)
from fairseq_linattn.attention.base import SelfAttention  # noqa: E402
from fairseq_linattn.attention.full import SoftmaxAttention  # noqa: E402
from fairseq_linattn.models.standalone import DictionaryTask, build_model  # noqa: E402,F401  (used by the scripts)

MB = 1024.0 * 1024.0


# ------------------------------------------------------------------------------------------------ machine
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg() -> List[float]:
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return [float("nan")] * 3


# glibc returns freed blocks above its mmap threshold (and the top of the heap past its trim threshold) to the
# OS, so a step's large activations are page-faulted in again on the next step; ``--malloc keep`` re-runs the
# script with these settings so that freed memory is kept and reused (what a caching allocator does). Measured
# at n=4096 in bench_lm_training: every model's step gets faster, the linear and attention-free ones most.
MALLOC_KEEP = {
    "MALLOC_MMAP_THRESHOLD_": str(32 * 1024**2),  # glibc's maximum: smaller blocks come from the heap
    "MALLOC_TRIM_THRESHOLD_": str(16 * 1024**3),  # never shrink the heap
    "MALLOC_TOP_PAD_": str(512 * 1024**2),  # grow it in large steps
}


def malloc_settings() -> str:
    found = [f"{k}={os.environ[k]}" for k in sorted(os.environ) if k.startswith("MALLOC_") and k.endswith("_")]
    return ", ".join(found) if found else "glibc defaults"


def output_name(name: str, args) -> str:
    return f"{name}_malloc_keep" if args.malloc == "keep" else name


def machine_info(threads: int) -> Dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "torch": torch.__version__,
        "threads": threads,
        "python": platform.python_version(),
        "mem_total_gb": round(mem_info("MemTotal") / 1024**3, 1),
        "malloc": malloc_settings(),
    }


def mem_info(key: str = "MemAvailable") -> float:
    """Bytes of /proc/meminfo's ``key`` (MemAvailable by default)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return float(line.split()[1]) * 1024
    return float("nan")


def fmt_load(load: List[float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def machine_line(info: Dict, load_start: List[float], load_end: List[float]) -> str:
    return (
        f"CPU: {info['cpu']}, {info['usable_cores']} cores, {info['mem_total_gb']} GB; torch {info['torch']} "
        f"({info['threads']} threads), Python {info['python']}, fp32; load average (1/5/15 min) "
        f"at start {fmt_load(load_start)}, at end {fmt_load(load_end)}; malloc: {info.get('malloc', 'glibc defaults')}"
    )


def wait_for_quiet(threshold: float, max_wait: float, poll: float = 10.0) -> Dict:
    """Wait until the 1-minute load average is below ``threshold`` (at most ``max_wait`` seconds)."""
    start = time.time()
    load = loadavg()
    announced = False
    while load[0] >= threshold and time.time() - start < max_wait:
        if not announced:
            print(f"waiting for the machine to get quiet: load {fmt_load(load)} >= {threshold} "
                  f"(at most {max_wait:.0f} s)", flush=True)
            announced = True
        time.sleep(poll)
        load = loadavg()
    waited = time.time() - start
    quiet = load[0] < threshold
    if announced:
        print(f"{'quiet' if quiet else 'still busy, running anyway'} after {waited:.0f} s: load {fmt_load(load)}",
              flush=True)
    return {"waited_s": round(waited, 1), "quiet": quiet, "load": load, "threshold": threshold}


def parse_ints(text) -> List[int]:
    """"1024,4096" -> [1024, 4096]"""
    return [int(x) for x in str(text).split(",") if x]


def common_args(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (for development)")
    parser.add_argument("--out", default=os.path.join(ROOT, "results"), help="output directory (default: results/)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--load-threshold", type=float, default=0.5,
                        help="wait until the 1-minute load average is below this before a full run")
    parser.add_argument("--max-wait", type=float, default=600.0,
                        help="seconds to wait for a quiet machine before running anyway (default 600)")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-case peak-memory subprocesses")
    parser.add_argument("--malloc", choices=["default", "keep"], default="default",
                        help="keep: re-run with glibc set to keep freed memory (MALLOC_KEEP) for every case; "
                             "results get a _malloc_keep suffix")
    return parser


def parse_args(parser: argparse.ArgumentParser, quick: Dict) -> argparse.Namespace:
    """Parse the command line; with --quick, ``quick`` replaces the defaults (explicit options still win)."""
    if "--quick" in sys.argv:
        parser.set_defaults(**quick)
    return parser.parse_args()


def start_run(args) -> Dict:
    if args.malloc == "keep" and any(os.environ.get(k) != v for k, v in MALLOC_KEEP.items()):
        # glibc reads these once, at start-up: run this script again in a process that has them
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **MALLOC_KEEP})
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    wait = {"waited_s": 0.0, "quiet": None, "load": loadavg(), "threshold": args.load_threshold}
    if not args.quick:
        wait = wait_for_quiet(args.load_threshold, args.max_wait)
    return {"machine": info, "wait": wait, "load_start": loadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


# ------------------------------------------------------------------------------------------------ models
def transformer_layers(model: nn.Module) -> List[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (TransformerEncoderLayerBase, TransformerDecoderLayerBase))]


class ZeroAttention(nn.Module):
    """Self-attention replaced by zeros (no parameters, no work): the model without attention, the ceiling of
    any attention speed-up. Keeps fairseq's call contract (``(output, weights)``, incremental state hooks)."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads

    def forward(self, query, key=None, value=None, key_padding_mask=None, incremental_state=None,
                need_weights=False, static_kv=False, attn_mask=None, before_softmax=False,
                need_head_weights=False):
        return torch.zeros_like(query), None

    def _get_input_buffer(self, incremental_state):
        return {}

    def _set_input_buffer(self, incremental_state, buffer):
        return incremental_state

    def reorder_incremental_state(self, incremental_state, new_order):
        return incremental_state


class ProjectionsOnlyAttention(SelfAttention):
    """The d x d projections of multi-head attention on all n positions with the mixing between them replaced
    by a sum: ``out_proj(q_proj(x) + k_proj(x) + v_proj(x))``. Every attention that keeps fairseq's q/k/v/out
    projections (softmax, kernel) does at least this work, so a model with it is the floor of their step time
    and its speed-up over the softmax model the ceiling of theirs. Needs no incremental state.

    ``inputs`` names the input projections kept: Linformer projects keys and values after compressing the
    sequence to k rows, so its n-row work is only ``("q_proj",)`` and the output projection."""

    def __init__(self, embed_dim: int, num_heads: int, inputs=("q_proj", "k_proj", "v_proj")):
        super().__init__(embed_dim, num_heads)
        self.inputs = tuple(inputs)

    def attend(self, query, padding_mask, attn_mask, incremental_state, need_weights):
        mixed = getattr(self, self.inputs[0])(query)
        for name in self.inputs[1:]:
            mixed = mixed + getattr(self, name)(query)
        return self.split_heads(mixed), None  # merged into out_proj by SelfAttention


def as_projections_only(old: nn.Module, inputs=("q_proj", "k_proj", "v_proj")) -> ProjectionsOnlyAttention:
    new = ProjectionsOnlyAttention(old.embed_dim, old.num_heads, inputs)
    new.load_state_dict({k: v for k, v in old.state_dict().items() if k.split(".")[0].endswith("proj")})
    return new


def as_query_output_projections_only(old: nn.Module) -> ProjectionsOnlyAttention:
    return as_projections_only(old, inputs=("q_proj",))


def swap_attention(model: nn.Module, factory: Callable[[nn.Module], nn.Module]) -> nn.Module:
    """Replace every layer's ``self_attn`` by ``factory(old_self_attn)``."""
    for layer in transformer_layers(model):
        layer.self_attn = factory(layer.self_attn)
    return model


def as_softmax_attention(old: nn.Module) -> SoftmaxAttention:
    """fairseq's MultiheadAttention -> SoftmaxAttention (PyTorch SDPA) with the same weights."""
    new = SoftmaxAttention(old.embed_dim, old.num_heads, dropout=getattr(old, "dropout_module").p
                           if hasattr(old, "dropout_module") else 0.0)
    new.load_state_dict(old.state_dict())
    return new


def as_zero_attention(old: nn.Module) -> ZeroAttention:
    return ZeroAttention(old.embed_dim, old.num_heads)


# ------------------------------------------------------------------------------------------------ timing
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


def profile_markdown(profiles: Dict[str, Dict]) -> List[str]:
    lines = []
    for name, prof in profiles.items():
        lines += [f"`{name}`: {prof['wall_ms']:.0f} ms wall under the profiler", ""]
        lines.append(md_table(["op", "input shapes", "calls", "self ms", "%"], [
            [e["op"], f"`{e['shapes']}`", e["calls"], f"{e['self_ms']:.1f}", f"{e['percent']:.1f}"]
            for e in prof["top"]]))
        lines.append("")
    return lines


# ------------------------------------------------------------------------------------------------ memory
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


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        # the server imports these once; each case is then a fork of a process that has run nothing
        _CONTEXT.set_forkserver_preload(["torch", "fairseq_linattn", "bench_common", "__main__"])
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
    ctx = _context()
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


# ------------------------------------------------------------------------------------------------ output
def md_table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_ms(seconds: Optional[float]) -> str:
    if seconds is None or seconds != seconds:
        return "–"
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 1 else f"{ms:.3f} ms"


def fmt_x(ratio: Optional[float]) -> str:
    return "–" if ratio is None or ratio != ratio else f"{ratio:.2f}x"


def fmt_mb(mb: Optional[float]) -> str:
    return "–" if mb is None or mb != mb else f"{mb:.0f} MB" if mb >= 10 else f"{mb:.1f} MB"


def write_outputs(out_dir: str, name: str, markdown: str, data: Dict, figure=None):
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    paths["md"] = os.path.join(out_dir, f"{name}.md")
    with open(paths["md"], "w") as f:
        f.write(markdown.rstrip() + "\n")
    paths["json"] = os.path.join(out_dir, f"{name}.json")
    with open(paths["json"], "w") as f:
        json.dump(data, f, indent=1, default=float)
    if figure is not None:
        paths["png"] = os.path.join(out_dir, f"{name}.png")
        figure.savefig(paths["png"], dpi=110, bbox_inches="tight")
    print("wrote " + ", ".join(paths.values()))
    return paths


def log_axes(ax, xlabel: str, ylabel: Optional[str] = None, logy: bool = True):
    """The benchmark plots' axes: lengths / positions on a log2 x axis, a grid, and (by default) log y."""
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def pyplot():
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
