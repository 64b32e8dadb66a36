#!/usr/bin/env python
"""Linformer paper, Table 3, on this CPU: inference time and peak memory of linformer_roberta against RoBERTa.
The benchmark itself: scripts/linattn_benchmarks/linformer.py (--help for its options)."""
from linattn_benchmarks.linformer import main

if __name__ == "__main__":
    main()
