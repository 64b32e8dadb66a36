#!/usr/bin/env python
"""Benchmark the causal linear-attention op: forward + backward time and peak memory against its quadratic
reference, PyTorch's causal softmax attention (SDPA) and fast-transformers' CPU kernel (when installed). The
benchmark itself: scripts/linattn_benchmarks/causal_op.py (--help for its options)."""
from linattn_benchmarks.causal_op import main

if __name__ == "__main__":
    main()
