#!/usr/bin/env python
"""Causal LM training throughput on this CPU: linear_transformer_lm against fairseq's transformer_lm. The
benchmark itself: scripts/linattn_benchmarks/lm_training.py (--help for its options)."""
from linattn_benchmarks.lm_training import main

if __name__ == "__main__":
    main()
