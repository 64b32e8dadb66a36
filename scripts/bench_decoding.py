#!/usr/bin/env python
"""Generation on this CPU: per-token latency against position, linear_transformer_lm (RNN mode) against fairseq's
KV-cached transformer_lm. The benchmark itself: scripts/linattn_benchmarks/decoding.py (--help for its options)."""
from linattn_benchmarks.decoding import main

if __name__ == "__main__":
    main()
