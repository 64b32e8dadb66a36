#!/usr/bin/env python
"""Are the models worth training? The papers' quality claims measured side by side on the embedded corpus.
The benchmark itself: fairseq_linattn/bench/quality.py (--help for its options)."""
from fairseq_linattn.bench.quality import main

if __name__ == "__main__":
    main()
