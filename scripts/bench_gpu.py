#!/usr/bin/env python
"""The GPU tables (bf16, one GPU, needs fla-core): Linformer's Table 3, the causal ops against fla-core and SDPA, LM
training and decoding throughput. The benchmark itself: scripts/linattn_benchmarks/gpu.py (--help for its options);
scripts/gpu_run.sh runs it on a lent GPU."""
from linattn_benchmarks.gpu import main

if __name__ == "__main__":
    main()
