#!/usr/bin/env python
"""Translation side by side: fairseq's softmax transformer and linear_transformer on the system's message catalogs.
The benchmark itself: scripts/linattn_benchmarks/translation.py (--help for its options)."""
from linattn_benchmarks.translation import main

if __name__ == "__main__":
    main()
