#!/usr/bin/env python
"""Multi-query associative recall for every mechanism beside softmax. The benchmark itself:
scripts/linattn_benchmarks/recall.py (--help for its options)."""
from linattn_benchmarks.recall import main

if __name__ == "__main__":
    main()
