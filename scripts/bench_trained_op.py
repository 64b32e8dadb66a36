#!/usr/bin/env python
"""The chunked ops on a trained model's own inputs, against kernel attention's. The benchmark itself:
scripts/linattn_benchmarks/trained_op.py (--help for its options)."""
from linattn_benchmarks.trained_op import main

if __name__ == "__main__":
    main()
