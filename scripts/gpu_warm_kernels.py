#!/usr/bin/env python
"""Compile fla-core's kernels for the CUDA tests and the GPU tables on every core at once, before they run (a fresh
GPU machine otherwise compiles them one at a time inside the tests and benchmarks). The work itself:
scripts/linattn_benchmarks/kernel_warmup.py (--help for its options); scripts/gpu_run.sh runs it first."""
import sys

from linattn_benchmarks.kernel_warmup import main

if __name__ == "__main__":
    sys.exit(1 if main() else 0)
