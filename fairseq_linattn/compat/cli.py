"""Command lines read as a user expects: ``--help`` lists the options of the model, task and criterion the
command line names, and mistakes that fairseq finds late are one-line errors when the command line is parsed.

fairseq parses a command line twice: first to learn ``--arch``, ``--task``..., then again after adding their
options. ``-h`` ends the first parse, so fairseq's help never shows a model's options (``fairseq-train --arch
transformer_lm --help`` lists no ``--decoder-layers``; ours, no ``--linear-attention``). Here ``-h`` waits for
the second parse: the parser gets every option the named arch, task, criterion and optimizer add, and then
prints its help. (The plugin is imported from ``--user-dir`` while fairseq builds the parser, before
``parse_args_and_arch`` runs: the patch is in place for that call.)

After the parse, :func:`command_line_problem` looks for what would otherwise fail later with a traceback: our
models' attention options (checked when the model is built, after data loading), ``--beam 0`` (fails in the
middle of generation), ``fairseq-eval-lm --context-window`` not below ``--tokens-per-sample`` (a bare
ValueError), ``fairseq-train --fp16`` where torch sees no CUDA GPU ("Torch not compiled with CUDA enabled"
when the optimizer is built) and ``--post-process sentencepiece`` with ``--bpe sentencepiece`` (the text decoded
twice: words without spaces between them, scored without a word), a ``--path`` that is missing, damaged or no
checkpoint (found after the data was loaded), our tasks' options, a ``--restore-file`` of our model built with other
layer norms or sizes (``--encoder-normalize-before`` dropped from a finetuning command: the load failed after the data,
naming tensors) and a ``--num-classes`` other than the label dictionary's size (too few ended mid-training in
"Target 5 is out of bounds", too many trained silently). Each is argparse's ``<command>: error: <message>`` and exit
status 2.

Both apply to command lines of our models, tasks and criteria (:mod:`.scope`: an ``--arch``, ``--task`` or
``--criterion`` of ours, or checkpoints of our models), or to every command line with ``FAIRSEQ_LINATTN_ALL_MODELS=1``;
fairseq's own get fairseq's help and fairseq's checks. One check applies to every command line: a ``--path`` that is
missing or cannot be loaded, on which fairseq fails anyway (after loading the data): the same failure, at start-up, in
one line.
"""
import argparse
import sys

from fairseq import options

from . import scope

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
        if helps and any(arg in HELP for arg in argv) and not scope.applies(cfg=named_in(argv)):
            return original(parser, input_args, parse_known, suppress_defaults, modify_parser)  # fairseq's own help
        if not helps or not any(arg in HELP for arg in argv):
            parsed = original(parser, input_args, parse_known, suppress_defaults, modify_parser)
            problem = command_line_problem(parsed[0] if parse_known else parsed)
            if problem:
                parser.error(problem)
            return parsed
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


def named_in(argv) -> argparse.Namespace:
    """The arch, task, criterion and checkpoints a command line names, read without parsing it (the parse would
    already print fairseq's help)."""
    named = argparse.Namespace(arch=None, task=None, criterion=None, path=None)
    for i, arg in enumerate(argv):
        for dest, flags in (("arch", ("--arch", "-a")), ("task", ("--task",)), ("criterion", ("--criterion",)),
                            ("path", ("--path",))):
            for flag in flags:
                if arg == flag and i + 1 < len(argv):
                    setattr(named, dest, argv[i + 1])
                elif arg.startswith(flag + "="):
                    setattr(named, dest, arg[len(flag) + 1:])
    return named


def refresh_help(parser):
    """The help of options that list a registry, as it is now (a mechanism registered after the plugin's import
    is listed too)."""
    from ..attention.options import current_help

    texts = current_help()
    for action in parser._actions:
        if action.dest in texts and action.help:
            written, now = texts[action.dest]
            action.help = action.help.replace(written, now)


def command_line_problem(args):
    """What is wrong with a parsed command line that fairseq would only find later, or None."""
    problem = checkpoint_path_problem(args)  # fairseq fails on it anyway: one line for every model
    if problem or not scope.applies(cfg=args):
        return problem
    beam = getattr(args, "beam", None)
    if beam is not None and beam < 1:
        return f"--beam is the number of hypotheses kept per sentence and must be at least 1, got {beam}"
    training = getattr(args, "max_update", None) is not None  # (only fairseq-train's parser has it)
    if training and (getattr(args, "fp16", False) or getattr(args, "memory_efficient_fp16", False)):
        import torch

        # fairseq's fp16 optimizer puts its fp32 copy of the weights on torch.cuda.current_device(): without CUDA it
        # died there, after the data and model were loaded
        if not torch.cuda.is_available():
            return ("--fp16 trains on a CUDA GPU and torch sees none on this machine: pass --cpu instead (or --bf16 "
                    "--cpu for 16-bit training on the CPU)")
    if getattr(args, "bpe", None) == "sentencepiece" and getattr(args, "post_process", None) == "sentencepiece":
        # each removes the pieces' spaces and turns "▁" into a space: twice, the words run together (T-/D- lines,
        # and the scores computed on them), silently
        return ("--post-process sentencepiece and --bpe sentencepiece both decode the pieces, and decoded twice the "
                "words lose their spaces: pass only --bpe sentencepiece (with its --sentencepiece-model)")
    window, sample = getattr(args, "context_window", 0) or 0, getattr(args, "tokens_per_sample", None)
    if window > 0 and sample is not None and window >= sample:
        return (f"--context-window {window} must be smaller than --tokens-per-sample {sample}: each window scores "
                f"{sample} - {window} new tokens after {window} tokens of context (e.g. --context-window "
                f"{sample // 2})")
    problem = task_problem(args) or data_problem(args) or restore_problem(args) or classes_problem(args)
    if problem:
        return problem
    from fairseq.models import ARCH_MODEL_REGISTRY

    from ..attention.options import check_heads
    from ..models.plugin_model import PluginModel

    model = ARCH_MODEL_REGISTRY.get(getattr(args, "arch", None))
    if model is not None and issubclass(model, PluginModel):
        probe = argparse.Namespace(**vars(args))
        if getattr(probe, "max_positions", None) is None:  # as RoBERTa's build_model: the task's sample length
            probe.max_positions = getattr(probe, "tokens_per_sample", None)
        stack = model.attention_stack()
        try:
            options = stack.checked_options(probe)
            if getattr(args, "criterion", None) == "attention_transfer":
                from ..criterions.attention_transfer import startup_problem

                transfer = startup_problem(options, getattr(args, "transfer_params", "feature-maps"))
                if transfer:
                    return transfer
            width, heads = (getattr(probe, f"{stack.side}_{name}", None) for name in ("embed_dim", "attention_heads"))
            if width is not None and heads is not None:
                check_heads(int(width), int(heads), stack.side)
            layers = getattr(probe, f"{stack.side}_layers", None)
            if layers is not None:
                options.check_depth(layers, stack.side)
        except ValueError as error:
            return str(error)
        except (TypeError, KeyError):  # a value only the model's build knows: it checks them there
            pass
    return None


def task_problem(args):
    """Our tasks' option checks; for fairseq-train (the only parser with --max-update: validate and generate take
    the criterion from the checkpoint) also the criterion the task needs."""
    if getattr(args, "task", None) == "needle_retrieval" and hasattr(args, "train_documents"):
        from ..tasks.needle_retrieval import NeedleRetrievalTask

        criterion = getattr(args, "criterion", None)
        if hasattr(args, "max_update") and criterion != NeedleRetrievalTask.CRITERION:
            return (f"--task needle_retrieval scores the answer only: use --criterion {NeedleRetrievalTask.CRITERION}, "
                    f"not {criterion}")
        return NeedleRetrievalTask.data_problem(args)
    if getattr(args, "task", None) != "associative_recall" or not hasattr(args, "num_keys"):
        return None  # (fairseq-validate reads the task's options from the checkpoint, not from its command line)
    from ..tasks.associative_recall import AssociativeRecallTask

    try:
        AssociativeRecallTask.check(args)
        for split in str(getattr(args, "valid_subset", "") or "").split(","):
            AssociativeRecallTask.split_shapes(args, split)
    except ValueError as error:
        return str(error)
    criterion = getattr(args, "criterion", None)
    if hasattr(args, "max_update") and criterion != AssociativeRecallTask.CRITERION:
        return (f"--task associative_recall scores the asked positions only: use --criterion "
                f"{AssociativeRecallTask.CRITERION}, not {criterion}")
    return None


def checkpoint_path_problem(args):
    """fairseq-generate, -validate, -eval-lm and -interactive load ``--path`` (``a.pt:b.pt`` for an ensemble) after
    the data: a missing file was fairseq's "Model file not found" traceback, a damaged or foreign one ours. Both are
    known from the file alone, so they are one line at start-up."""
    import os

    from ..checkpoints.integrity import unreadable_reason

    path = getattr(args, "path", None)
    if not path or int(getattr(args, "checkpoint_shard_count", 1) or 1) > 1:
        return None  # (sharded checkpoints are found by suffixes fairseq adds)
    for file in str(path).split(os.pathsep):
        if "://" in file:
            continue
        if not os.path.isfile(file):
            folder = os.path.dirname(file) or "."
            saved = sorted(f for f in os.listdir(folder) if f.endswith(".pt")) if os.path.isdir(folder) else []
            return (f"--path {file} does not exist" + (f"; {folder} holds {', '.join(saved[:6])}" if saved else
                                                      "") + ": pass a checkpoint that fairseq-train saved")
        reason = unreadable_reason(file)
        if reason:
            return f"--path {file} cannot be loaded: {reason}"
    return None


def data_problem(args):
    """The data folder(s) fairseq reads its dictionaries and splits from (``a:b`` for shards), missing: fairseq's
    FileNotFoundError about ``dict.txt`` came after the model or the task had started."""
    import os

    data = getattr(args, "data", None)
    if not data or not isinstance(data, str):
        return None
    for folder in data.split(os.pathsep):
        if folder and "://" not in folder and not os.path.exists(folder):
            return (f"the data folder {folder} does not exist: pass the --destdir of fairseq-preprocess (the folder "
                    f"with dict.txt and the binarized splits)")
    return None


# the options that shape a model's tensors: a --restore-file trained with other values does not load (the positions and
# Linformer's k are told where the checkpoint is loaded, with the identity options: checkpoints/fit.py)
STRUCTURE_OPTIONS = ("encoder_normalize_before", "decoder_normalize_before", "encoder_layers", "encoder_embed_dim",
                     "encoder_ffn_embed_dim", "encoder_attention_heads", "decoder_layers", "decoder_embed_dim",
                     "decoder_ffn_embed_dim", "decoder_attention_heads")


def restore_problem(args):
    """fairseq-train --restore-file / --finetune-from-model naming a checkpoint of ours built with other layer norms
    or sizes than the command line's (a finetuning command that dropped --encoder-normalize-before): the load failed
    after the data was read, naming tensors; here, at start-up, naming the options."""
    import os

    from ..checkpoints.fit import model_class, saved_model_cfg

    if not hasattr(args, "max_update"):
        return None
    for option in ("finetune_from_model", "restore_file"):
        path = getattr(args, option, None)
        if not path or path == "checkpoint_last.pt" or not os.path.isfile(path):
            continue
        try:
            saved = saved_model_cfg(path)
            if model_class(saved) is None:
                continue
        except Exception:  # noqa: BLE001 - damaged or foreign: fairseq's own loading reports it
            continue
        fixes = []
        for key in STRUCTURE_OPTIONS:
            old, new = getattr(saved, key, None) if not isinstance(saved, dict) else saved.get(key), getattr(args, key, None)
            if old is None or new is None or old == new:
                continue
            flag = "--" + key.replace("_", "-")
            if isinstance(old, bool) or isinstance(new, bool):
                fixes.append(f"add {flag} (it was trained pre-LN)" if old else f"drop {flag} (it was trained post-LN)")
            else:
                fixes.append(f"{flag} {old} (not {new})")
        if fixes:
            return (f"--{option.replace('_', '-')} {path} was trained with other model options, so its weights do not "
                    f"fit this model: {'; '.join(fixes)}")
    return None


def classes_problem(args):
    """fairseq-train --task sentence_prediction with a --num-classes other than the label dictionary's size: too few
    ended mid-training ("IndexError: Target 5 is out of bounds"), too many trained a head with outputs no label has,
    silently."""
    import os

    if (not hasattr(args, "max_update") or getattr(args, "task", None) != "sentence_prediction"
            or getattr(args, "regression_target", False) or not isinstance(getattr(args, "data", None), str)):
        return None
    labels_file = os.path.join(args.data.split(os.pathsep)[0], "label", "dict.txt")
    if not os.path.isfile(labels_file):
        return None
    with open(labels_file, encoding="utf-8") as f:
        # (fairseq-preprocess pads a dictionary to a multiple of 8 with madeupwordNNNN entries: no label is one)
        labels = [word for word in (line.split(" ")[0] for line in f if line.strip()) if not word.startswith("madeupword")]
    classes = getattr(args, "num_classes", None)
    if classes is not None and classes != len(labels):
        shown = ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")
        return (f"--num-classes {classes} but {labels_file} holds {len(labels)} labels ({shown}): pass --num-classes "
                f"{len(labels)}")
    return None
