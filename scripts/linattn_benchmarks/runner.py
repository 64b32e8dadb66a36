"""One runner for every benchmark: a benchmark declares what to measure, the runner measures it side by side.

A :class:`Benchmark` says which points to measure (lengths, positions...), which cases at each point (a
function to time each, or the reason to skip it), which ratios to compute against which baseline, and how
to render the results; :func:`run` does the rest:

* the command line (``--quick``, ``--out``, ``--threads``, ``--no-memory``, ``--malloc keep``, the timing
  flags) and, for a full run, waiting for a quiet machine;
* time: the cases of a point interleaved round by round (see :func:`.measure.interleaved_times`);
* memory: each case again in a fresh process (:func:`.measure.isolated`);
* the machine line, the markdown, JSON and PNG in ``results/``, the verdicts printed last.
"""
import argparse
import contextlib
import gc
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Union

import torch

from . import machine, measure, report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "results")


@dataclass
class Timed:
    """A case's timed call, and what must run untimed before each call (a fresh decoding state, say)."""

    call: Callable[[], object]
    setup: Optional[Callable[[], object]] = None


Case = Union[Callable[[], object], Timed, str]  # a call to time, or the reason the case is skipped


class Benchmark:
    """What a benchmark measures; the subclass's module docstring is its description."""

    name = ""  # results/<name>.md / .json / .png
    quick: Dict = {}  # --quick: smaller defaults (explicit options still win)
    timing_defaults = dict(warmup=1, repeats=5, budget=6.0)
    baselines: Dict[str, str] = {}  # per-case ratio column -> baseline case: baseline median / case median

    def add_args(self, parser: argparse.ArgumentParser):
        """The benchmark's own options."""

    def problem(self, args) -> str:
        """What is wrong with a combination of the options (argparse's ``error:`` line), or ""."""
        return ""

    def points(self, args) -> List[Dict]:
        """What to measure at, e.g. ``[{"n": 1024}, {"n": 4096}]``: each becomes columns of every result row."""
        raise NotImplementedError

    def cases(self, args, point: Dict, history: Dict[str, List[Dict]]) -> Dict[str, Case]:
        """The cases at ``point``, built now; ``history`` holds each case's earlier result rows (to predict)."""
        raise NotImplementedError

    def timing(self, args, point: Dict, history: Dict[str, List[Dict]]) -> Dict:
        """Arguments of :func:`.measure.interleaved_times` for this point."""
        return dict(warmup=args.warmup, repeats=args.repeats, budget_s=args.budget, min_repeats=3)

    # a module-level function (args, point, case) -> {"baseline_mb", "peak_mb", "delta_mb"}, run in a fresh
    # process per case; None: no memory column
    memory_worker: Optional[Callable] = None

    def measures_memory(self, point: Dict) -> bool:
        """Whether ``memory_worker`` measures the cases at ``point`` (a part with nothing to say skips the processes)."""
        return True

    def after_point(self, args, point: Dict, cases: Dict[str, Case], data: Dict):
        """While the point's cases are still built: profiles, cross-checks (write them into ``data``)."""

    def render(self, data: Dict):
        """-> (markdown, verdict lines). ``data``: machine, load, args, ``results`` (one row per point and case)."""
        raise NotImplementedError

    def plot(self, data: Dict):
        """A matplotlib figure of the results, or None."""
        return None


class Study(Benchmark):
    """A benchmark that runs whole experiments (fairseq's command lines, say) instead of timing calls: it
    fills ``data["results"]`` itself in :meth:`measure`; the runner still gives it the command line, the
    machine line and the md/json/png outputs."""

    timing_defaults: Dict = {}

    def measure(self, args, data: Dict):
        raise NotImplementedError


def parser_for(benchmark: Benchmark) -> argparse.ArgumentParser:
    doc = sys.modules[type(benchmark).__module__].__doc__ or ""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats (for development)")
    parser.add_argument("--out", default=RESULTS, help="output directory (default: results/)")
    parser.add_argument("--threads", type=positive_int, default=2,
                        help="torch threads of this process and of the fairseq commands it runs (default 2)")
    parser.add_argument("--load-threshold", type=float, default=0.5,
                        help="wait until the 1-minute load average is below this before a full run")
    parser.add_argument("--max-wait", type=float, default=600.0,
                        help="seconds to wait for a quiet machine before running anyway (default 600)")
    parser.add_argument("--malloc", choices=["default", "keep"], default="default",
                        help="keep: re-run with glibc set to keep freed memory (MALLOC_KEEP) for every case; "
                             "results get a _malloc_keep suffix")
    if not isinstance(benchmark, Study):
        parser.add_argument("--no-memory", action="store_true", help="skip the per-case peak-memory processes")
        parser.add_argument("--warmup", type=int, default=benchmark.timing_defaults["warmup"])
        parser.add_argument("--repeats", type=int, default=benchmark.timing_defaults["repeats"],
                            help="timed repeats per case (at most)")
        parser.add_argument("--budget", type=float, default=benchmark.timing_defaults["budget"],
                            help="seconds of timed repeats per case (slow cases get fewer repeats)")
    benchmark.add_args(parser)
    return parser


def parse_args(benchmark: Benchmark, argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = parser_for(benchmark)
    argv = sys.argv[1:] if argv is None else argv
    if "--quick" in argv:
        parser.set_defaults(**benchmark.quick)
    args = parser.parse_args(argv)
    problem = benchmark.problem(args)
    if problem:
        parser.error(problem)
    return args


def no_gpu_for(args, scales: Dict) -> str:
    """argparse's error line for ``--scale`` (of ``scales``) that trains on a CUDA GPU (its device arguments without
    --cpu) where torch sees none, else "" (also for --quick): said at start-up, not by the first fairseq-train after
    the wait for a quiet machine and the data."""
    device_args = scales[args.scale].device
    if args.quick or "--cpu" in device_args or torch.cuda.is_available():
        return ""
    return (f"--scale {args.scale} trains with {' '.join(device_args)} on a CUDA GPU and torch sees none on this "
            "machine: run it on a GPU machine, or leave --scale out (the default scale runs on CPU)")


def positive_list(kind: type, what: str, example: str):
    """An argparse ``type``: comma-separated values of ``kind``, each > 0 (e.g. "1,2,4" -> [1, 2, 4]); anything
    else is argparse's one-line error."""
    def parse(text) -> list:
        try:
            values = [kind(x) for x in str(text).split(",") if x]
        except ValueError:
            values = []
        if not values or min(values) <= 0:
            raise argparse.ArgumentTypeError(f"expected {what}, comma-separated (e.g. {example}), got {text!r}")
        return values
    return parse


def existing_file(text: str) -> str:
    """An argparse ``type``: a path to a file that is there (a results JSON to read back)."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text} is not a file (a results JSON written by an earlier run)")
    return text


def scale_work_dir(args) -> Path:
    """A study's folder for its scale: ``--work-dir`` / the scale's name (``quick`` for --quick)."""
    return Path(args.work_dir) / ("quick" if args.quick else args.scale)


def existing_dir(text: str) -> str:
    """An argparse ``type``: a path to a folder that is there."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    return text


def names_among(known) -> Callable[[str], List[str]]:
    """An argparse ``type``: comma-separated names, each one of ``known`` (read when the command line is parsed)."""
    def parse(text: str) -> List[str]:
        names = [name for name in text.split(",") if name]
        unknown = sorted(set(names) - set(known))
        if unknown or not names:
            problem = f"unknown {', '.join(unknown)}" if unknown else "no name given"
            raise argparse.ArgumentTypeError(f"{problem}; choose among {', '.join(known)}")
        return names
    return parse


positive_ints = positive_list(int, "whole numbers >= 1", "1,2,4")
positive_floats = positive_list(float, "numbers > 0", "5e-4,2e-3")


def positive_ints_or_none(text) -> List[int]:
    """:data:`positive_ints`, or an empty list for '' (none)."""
    return positive_ints(text) if str(text).strip() else []


def positive_number(kind: type, what: str) -> Callable[[str], object]:
    """An argparse ``type``: one value of ``kind``, > 0; anything else is argparse's one-line error."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected one {what}, got {text!r}")
        return value
    return parse


positive_int = positive_number(int, "whole number >= 1")
positive_float = positive_number(float, "number > 0")


def start(args) -> Dict:
    if args.malloc == "keep" and any(os.environ.get(k) != v for k, v in machine.MALLOC_KEEP.items()):
        # glibc reads these once, at start-up: run this command again in a process that has them
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **machine.MALLOC_KEEP})
    torch.set_num_threads(args.threads)
    # the fairseq commands a study runs (fairseq-train, -validate, -eval-lm) are processes of their own, which take
    # their thread count from the environment (torch's default is every core): without this, two studies side by
    # side at --threads 1 trained with two threads each and oversubscribed the machine
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    info = machine.machine_info(args.threads)
    wait = {"waited_s": 0.0, "quiet": None, "load": machine.loadavg(), "threshold": args.load_threshold}
    if not args.quick:
        wait = machine.wait_for_quiet(args.load_threshold, args.max_wait)
    return {"machine": info, "wait": wait, "load_start": machine.loadavg(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


@contextlib.contextmanager
def exit_on_sigterm():
    """Within the block SIGTERM (kill, a scheduler) ends the benchmark as Ctrl-C does, unwinding: the fairseq
    commands it started are killed on the way out (:func:`.fairseq_runs.fairseq`) instead of running on unseen."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(benchmark: Benchmark, argv: Optional[List[str]] = None) -> Dict:
    args = parse_args(benchmark, argv)
    with exit_on_sigterm():
        return _run(benchmark, args)


def _run(benchmark: Benchmark, args) -> Dict:
    data = {**start(args), "args": vars(args), "results": []}
    print(machine.machine_line(data["machine"], data["load_start"], data["load_start"]), flush=True)
    if isinstance(benchmark, Study):
        benchmark.measure(args, data)
    else:
        _measure_points(benchmark, args, data)
    data["load_end"] = machine.loadavg()
    markdown, verdicts = benchmark.render(data)
    verdicts = [verdicts] if isinstance(verdicts, str) else verdicts
    print()
    print(markdown)
    name = f"{benchmark.name}_malloc_keep" if args.malloc == "keep" else benchmark.name
    report.write_outputs(args.out, name, markdown, data, benchmark.plot(data))
    for verdict in verdicts:
        print(verdict)
    return data


def _measure_points(benchmark: Benchmark, args, data: Dict):
    """Each point's cases timed side by side (and their memory in fresh processes) into ``data["results"]``."""
    history: Dict[str, List[Dict]] = {}
    for point in benchmark.points(args):
        started = time.perf_counter()
        cases = benchmark.cases(args, point, history)
        timed = {name: case if isinstance(case, Timed) else Timed(case) for name, case in cases.items()
                 if not isinstance(case, str)}
        for name, case in cases.items():
            if isinstance(case, str):
                data["results"].append({**point, "case": name, "skipped": case})
                print(f"{point}: skipping {name}: {case}", flush=True)
        times = measure.interleaved_times({n: c.call for n, c in timed.items()},
                                          setup={n: c.setup for n, c in timed.items() if c.setup},
                                          **benchmark.timing(args, point, history))
        benchmark.after_point(args, point, cases, data)
        del cases, timed
        gc.collect()
        rows = []
        for name, ts in times.items():
            memory = {}
            if benchmark.memory_worker is not None and not args.no_memory and benchmark.measures_memory(point):
                memory = measure.isolated(benchmark.memory_worker, vars(args), point, name, threads=args.threads)
            rows.append({**point, "case": name, "times_s": ts, "median_s": measure.median(ts), "best_s": min(ts),
                         "memory": memory})
        _add_ratios(rows, benchmark.baselines)
        for row in rows:
            history.setdefault(row["case"], []).append(row)
        data["results"] += rows
        line = ", ".join(f"{row['case']} {report.fmt_ms(row['median_s'])}" for row in rows)
        print(f"{point} ({time.perf_counter() - started:.0f} s, load {machine.fmt_load(machine.loadavg())}): {line}",
              flush=True)


def entry_point(benchmark_class):
    """``main(argv=None)`` of a benchmark module: run the benchmark from the command line."""

    def main(argv: Optional[List[str]] = None) -> Dict:
        return run(benchmark_class(), argv)

    return main


def _add_ratios(rows: List[Dict], baselines: Dict[str, str]):
    """Per case: ``<column>`` = baseline time / case time, and ``memory_saved_vs_<baseline>`` = baseline's peak
    memory added / the case's (when both were measured)."""
    by_case = {row["case"]: row for row in rows}
    for column, baseline in baselines.items():
        base = by_case.get(baseline)
        for row in rows:
            row[column] = base["median_s"] / row["median_s"] if base else None
            base_mb, mine_mb = (base or {}).get("memory", {}).get("delta_mb"), row["memory"].get("delta_mb")
            if base_mb and mine_mb and mine_mb > 0:
                row[f"memory_saved_vs_{baseline}"] = base_mb / mine_mb


def measured(results: List[Dict], **where) -> Optional[Dict]:
    """The (first) measured result row matching ``where`` (e.g. ``n=4096, case="linear"``), or None."""
    return next((r for r in results if "skipped" not in r and all(r.get(k) == v for k, v in where.items())), None)


def predicted(history: Dict[str, List[Dict]], case: str, key: str, value: float, power: float,
              memory: bool = False) -> Optional[float]:
    """The median time (or, with ``memory``, the peak memory added in MB) of ``case`` at ``key=value``,
    extrapolated from its last measurement as (value / last value) ** power; None before the first."""
    if not history.get(case):
        return None
    last = history[case][-1]
    measured_value = last["memory"].get("delta_mb") if memory else last["median_s"]
    return None if measured_value is None else measured_value * (value / last[key]) ** power
