#!/usr/bin/env python
"""Command-line entry for :mod:`fairseq_linattn.spectrum` (see its docstring, or run with --help)."""
from fairseq_linattn.spectrum import main

if __name__ == "__main__":
    main()
