"""The CUDA tests under ``FAIRSEQ_LINATTN_AUTOTUNE`` (scripts/gpu_run.sh sets ``first``): each fla-core kernel at
its first configuration that compiles and runs, instead of a search over up to 48 that a fresh GPU machine compiles
one at a time (scripts/linattn_benchmarks/autotune.py). A result must be right under any configuration a kernel
accepts; the benchmarks search in full. Unset (CPU, CI): nothing changes."""
import os

MODE = os.environ.get("FAIRSEQ_LINATTN_AUTOTUNE")
if MODE:
    from linattn_benchmarks import autotune

    autotune.set_mode(MODE)
