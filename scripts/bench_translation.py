#!/usr/bin/env python
"""Translation side by side: fairseq's softmax transformer and linear_transformer on the system's message catalogs.
The benchmark itself: fairseq_linattn/bench/translation.py (--help for its options)."""
from fairseq_linattn.bench.translation import main

if __name__ == "__main__":
    main()
