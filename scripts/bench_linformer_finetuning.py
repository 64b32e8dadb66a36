#!/usr/bin/env python
"""Does Linformer finetune as well as RoBERTa? Pretraining -> classification side by side on two real tasks.
The benchmark itself: scripts/linattn_benchmarks/finetuning.py (--help for its options)."""
from linattn_benchmarks.finetuning import main

if __name__ == "__main__":
    main()
