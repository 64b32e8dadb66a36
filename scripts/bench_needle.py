#!/usr/bin/env python
"""Needle retrieval (RULER's S-NIAH forms) for the quality study's language models. The benchmark itself:
scripts/linattn_benchmarks/needle.py (--help for its options)."""
from linattn_benchmarks.needle import main

if __name__ == "__main__":
    main()
