#!/usr/bin/env python
"""Generation on this CPU: per-token latency against position, linear_transformer_lm (RNN mode) against fairseq's
KV-cached transformer_lm. The benchmark itself: fairseq_linattn/bench/decoding.py (--help for its options)."""
from fairseq_linattn.bench.decoding import main

if __name__ == "__main__":
    main()
