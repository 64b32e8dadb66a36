"""Console scripts for the tools whose ``main`` returns what it made (for Python callers): a console script
exits with its function's return value, which sys.exit would print as an error, so these drop it."""


def warm_start():
    """``fairseq-linattn-warm-start``: :func:`fairseq_linattn.convert.command.main`."""
    from ..convert.command import main

    main()


def spectrum():
    """``fairseq-linattn-spectrum``: :func:`fairseq_linattn.spectrum.main`."""
    from ..spectrum import main

    main()
