#!/usr/bin/env python
"""--linear-attention retention / gla / delta / gated-delta beside transformer_lm and elu+1 on the embedded corpus:
causal-LM perplexity and perplexity by position past the training length. The benchmark itself:
scripts/linattn_benchmarks/quality.py (MechanismQualityBenchmark; --help for its options)."""
from linattn_benchmarks.quality import main_mechanisms

if __name__ == "__main__":
    main_mechanisms()
