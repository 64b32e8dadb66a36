"""``--help`` lists the options of the model, task and criterion the command line names.

fairseq parses a command line twice: first to learn ``--arch``, ``--task``..., then again after adding their
options. ``-h`` ends the first parse, so fairseq's help never shows a model's options (``fairseq-train --arch
transformer_lm --help`` lists no ``--decoder-layers``; ours, no ``--linear-attention``). Here ``-h`` waits for
the second parse: the parser gets every option the named arch, task, criterion and optimizer add, and then
prints its help. (The plugin is imported from ``--user-dir`` while fairseq builds the parser, before
``parse_args_and_arch`` runs: the patch is in place for that call.)
"""
import argparse
import sys

from fairseq import options

HELP = ("-h", "--help")


class _HelpLater(argparse.Action):
    """Stands in for argparse's help action: remembers that help was asked for, and lets the parse finish
    without the arguments it requires (the data folder...)."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.help_requested = True
        for action in parser._actions:
            action.required = False


def apply():
    if getattr(options.parse_args_and_arch, "patched_by_fairseq_linattn", False):
        return
    original = options.parse_args_and_arch

    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False,
                            modify_parser=None):
        argv = sys.argv[1:] if input_args is None else input_args
        helps = [a for a in parser._actions if isinstance(a, argparse._HelpAction)]
        if not helps or not any(arg in HELP for arg in argv):
            return original(parser, input_args, parse_known, suppress_defaults, modify_parser)
        for action in helps:
            action.__class__ = _HelpLater
        try:
            original(parser, input_args, True, False, modify_parser)
        except Exception:  # an option's own check failing without the required values: the help is still right
            pass
        refresh_help(parser)
        parser.print_help()
        sys.exit(0)

    parse_args_and_arch.patched_by_fairseq_linattn = True
    options.parse_args_and_arch = parse_args_and_arch


def refresh_help(parser):
    """The help of options that list a registry, as it is now (a mechanism registered after the plugin's import
    is listed too)."""
    from ..attention.options import current_help

    texts = current_help()
    for action in parser._actions:
        if action.dest in texts and action.help:
            written, now = texts[action.dest]
            action.help = action.help.replace(written, now)
