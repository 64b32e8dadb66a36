#!/usr/bin/env python
"""Command-line entry for :mod:`fairseq_linattn.data.translation_data` (see its docstring, or run with --help)."""
from fairseq_linattn.data.translation_data import main

if __name__ == "__main__":
    main()
