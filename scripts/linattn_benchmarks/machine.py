"""The machine a benchmark ran on, said in one line of its results, and a quiet machine to run on."""
import os
import platform
import time
from typing import Dict, List

import torch


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
        # never sleep past the limit: "--max-wait 1" means one second, not one poll
        time.sleep(min(poll, max(0.0, max_wait - (time.time() - start))))
        load = loadavg()
    waited = time.time() - start
    quiet = load[0] < threshold
    if announced:
        print(f"{'quiet' if quiet else 'still busy, running anyway'} after {waited:.0f} s: load {fmt_load(load)}",
              flush=True)
    return {"waited_s": round(waited, 1), "quiet": quiet, "load": load, "threshold": threshold}
