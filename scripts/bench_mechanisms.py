#!/usr/bin/env python
"""Speed of --linear-attention's mechanisms (elu, retention, gla, delta, gated-delta) on CPU: each op's forward +
backward and the linear_transformer_lm training step, against elu+1 (and transformer_lm). The benchmark itself:
scripts/linattn_benchmarks/mechanisms.py (--help for its options)."""
from linattn_benchmarks.mechanisms import main

if __name__ == "__main__":
    main()
