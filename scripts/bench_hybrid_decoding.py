#!/usr/bin/env python
"""Decoding the 3:1 hybrids: state memory and ms per token at 4K-64K positions, against transformer_lm's KV cache and
the all-recurrent stack. The benchmark itself: scripts/linattn_benchmarks/hybrid_decoding.py (--help for its options)."""
from linattn_benchmarks.hybrid_decoding import main

if __name__ == "__main__":
    main()
