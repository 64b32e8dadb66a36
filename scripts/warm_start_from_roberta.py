#!/usr/bin/env python
"""Command-line entry for :mod:`fairseq_linattn.convert` (see its docstring, or run with --help)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # usable from a checkout

from fairseq_linattn.convert import main  # noqa: E402

if __name__ == "__main__":
    main()
