#!/usr/bin/env python
"""Causal LM training throughput on this CPU: linear_transformer_lm against fairseq's transformer_lm. The
benchmark itself: fairseq_linattn/bench/lm_training.py (--help for its options)."""
from fairseq_linattn.bench.lm_training import main

if __name__ == "__main__":
    main()
