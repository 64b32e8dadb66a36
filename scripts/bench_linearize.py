#!/usr/bin/env python
"""A trained transformer_lm linearized (fairseq-linattn-warm-start, attention transfer, finetune) against the same
linear model trained from scratch. The benchmark itself: scripts/linattn_benchmarks/linearize.py (--help)."""
from linattn_benchmarks.linearize import main

if __name__ == "__main__":
    main()
