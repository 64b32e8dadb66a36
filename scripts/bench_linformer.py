#!/usr/bin/env python
"""Linformer paper, Table 3, on this CPU: inference time and peak memory of linformer_roberta against RoBERTa.
The benchmark itself: fairseq_linattn/bench/linformer.py (--help for its options)."""
from fairseq_linattn.bench.linformer import main

if __name__ == "__main__":
    main()
