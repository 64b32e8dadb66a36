"""``fairseq-linattn-warm-start``: the command line of :func:`fairseq_linattn.convert.convert`."""
import argparse
import logging
from pathlib import Path
from typing import Dict, List, Optional, Type

from . import INIT_PROJECTIONS, Conversion, convert
from . import __doc__ as PACKAGE_DOC
from .families import Family, OptionError, checkpoint_family, every_target, target_family, target_option_names


def main(argv: Optional[List[str]] = None) -> Conversion:
    parser = argparse.ArgumentParser(description=PACKAGE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="fairseq RoBERTa, transformer_lm or transformer checkpoint (e.g. "
                                       "checkpoints/checkpoint_best.pt)")
    parser.add_argument("output", help="where to write the converted checkpoint")
    parser.add_argument("--data", help="data-bin with the source's dict.txt (default: the one its cfg names); "
                                       "its valid split, if any, is the agreement sample")
    targets = every_target()
    parser.add_argument("--model", choices=sorted(targets),
                        help="the model to convert to (default: linformer_roberta for a RoBERTa, linear_transformer_lm "
                             "for a transformer_lm, linear_transformer for a transformer)")
    parser.add_argument("--max-positions", type=int,
                        help="RoBERTa: must equal the source's (its positional embeddings fix it); checked when given")
    parser.add_argument("--init-projection", choices=INIT_PROJECTIONS, default="default",
                        help="Linformer's learned/conv projections: as the model builds them (default), or "
                             "window averages (identity-like: the identity when k = n), closer to the source")
    parser.add_argument("--sample-split", default="valid", help="data split for the agreement summary")
    parser.add_argument("--sample-size", type=int, default=16, help="sequences in the agreement sample (0: skip)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the new projections / random features")
    every_option = add_every_target_option(parser, targets)
    args = parser.parse_args(argv)
    # as fairseq_cli does: importing fairseq leaves the root logger at DEBUG (its text_to_speech task)
    logging.basicConfig(format="%(levelname)s | %(name)s | %(message)s", level=logging.INFO, force=True)
    family = source_checkpoint_family(args.source, parser)
    model = args.model or family.default_target
    if target_family(model) is not family:
        parser.error(f"{args.source} is a {family.name} model: --model {model} is not one of its targets, "
                     f"{', '.join(family.targets())}")
    options = {name: getattr(args, name) for name in target_option_names(model)}
    foreign = [name for name in every_option if name not in options and getattr(args, name) is not None]
    if foreign:
        flags = ", ".join("--" + name.replace("_", "-") for name in foreign)
        parser.error(f"{flags}: not an option of --model {model}")
    try:
        conversion = convert(args.source, args.output, model, options, args.data, args.max_positions,
                             args.init_projection, args.sample_split, args.sample_size, args.seed)
    except OptionError as error:
        parser.error(str(error))
    print(conversion.summary())
    return conversion


def add_every_target_option(parser, targets: Dict[str, Type]) -> List[str]:
    """Each target's attention options, each flag once (defaults None: a flag given is a flag set; families that
    share an options class, as encoders and decoders do, add the same flags). Returns their names."""
    added = {}
    group = parser.add_argument_group("the target's attention (see --model)")
    for model in targets:
        scratch = argparse.ArgumentParser(add_help=False)
        target_family(model).add_options(model, scratch)
        for action in scratch._actions:
            if action.dest not in added:
                group.add_argument(*action.option_strings, dest=action.dest, type=action.type, choices=action.choices,
                                   metavar=action.metavar, help=action.help)
                added[action.dest] = None
    return list(added)


def source_checkpoint_family(source: str, parser) -> Family:
    """The family of the checkpoint at ``source`` (its cfg only is read); a mistake is the parser's error."""
    from ..checkpoints import CheckpointError
    from ..checkpoints.fit import saved_model_cfg

    if not Path(source).is_file():
        parser.error(f"{source}: no such checkpoint file")
    try:
        return checkpoint_family(saved_model_cfg(source), source)
    except (CheckpointError, OptionError) as error:
        parser.error(str(error))
