#!/usr/bin/env python
"""Command-line entry for :mod:`fairseq_linattn.convert` (see its docstring, or run with --help)."""
from fairseq_linattn.convert.command import main

if __name__ == "__main__":
    main()
