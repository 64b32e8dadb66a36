#!/usr/bin/env python
"""Are the models worth training? The papers' quality claims measured side by side on the embedded corpus.
The benchmark itself: scripts/linattn_benchmarks/quality.py (--help for its options)."""
from linattn_benchmarks.quality import main

if __name__ == "__main__":
    main()
