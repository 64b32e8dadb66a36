"""Warm-start one of our models from a trained fairseq softmax model: RoBERTa -> ``linformer_roberta`` or
``linear_roberta``, ``transformer_lm`` -> ``linear_transformer_lm`` (any causal mechanism or layout), ``transformer``
(translation) -> ``linear_transformer`` (each role's attention as its options say).

    python scripts/warm_start_from_roberta.py roberta/checkpoint_best.pt linformer/warm_start.pt \\
        --data data-bin/corpus --compressed 4 --init-projection identity-like
    fairseq-linattn-warm-start lm/checkpoint_best.pt linear/warm_start.pt --feature-map hedgehog

Every weight the two models share is copied as it is: token and positional embeddings, layer norms, the
q/k/v/out projections (our attention keeps fairseq's parameter names), the FFNs, the output heads and any
classification heads. What the source does not have is initialised as the model builds it: Linformer's
sequence projections (or, with ``--init-projection identity-like``, as window averages: the identity when
k = n), FAVOR+'s random features, learned feature maps (hedgehog and t2r start as a fixed map), a mechanism's
gates, decays, convolution and norms. The output is a plain fairseq checkpoint, without the source's optimizer
state, whose cfg names our arch and options: fairseq-validate, fairseq-eval-lm and ``from_pretrained`` load it
as is, and training continues from it with

    fairseq-train ... --arch linformer_roberta_base <the printed flags> \\
        --restore-file linformer/warm_start.pt --reset-optimizer --reset-dataloader --reset-meters

first with ``--criterion attention_transfer`` when the feature maps learn (Hedgehog / LoLCATs: they learn to
reproduce each layer's softmax attention), then with the task's own criterion (examples/linearize). The summary
lists copied and new tensors and how close the converted model is to the source on a sample (cosine similarity
of the final features, agreement of the output heads' top-1 predictions).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch
from fairseq import checkpoint_utils
from fairseq.dataclass.utils import overwrite_args_by_name
from fairseq.models import ARCH_CONFIG_REGISTRY, MODEL_DATACLASS_REGISTRY, build_model
from omegaconf import OmegaConf

from ..attention.base import SelfAttention
from ..attention.feature_maps import FeatureMap, LearnedFeatureMap
from ..attention.projections import SequenceProjection
from ..models.plugin_model import PluginModel
from .agreement import Agreement, agreement, sample_batch
from .families import (
    FAMILIES,
    Family,
    OptionError,
    checkpoint_family,
    every_target,
    source_family,
    target_family,
    target_option_names,
)

INIT_PROJECTIONS = ("default", "identity-like")
FAIRSEQ_PROJECTIONS = ("q_proj.", "k_proj.", "v_proj.", "out_proj.")  # an attention's weights that the source has


# ---------------------------------------------------------------------------------------------- source
@dataclass
class Source:
    model: object  # a fairseq RobertaModel, TransformerLanguageModel or TransformerModel
    task: object
    cfg: object  # the checkpoint's cfg, with --data applied
    model_args: Namespace  # the checkpoint's cfg.model as it was saved: the basis of the target's
    family: Family


def load_source(path: str | Path, data: Optional[str | Path] = None) -> Source:
    """Load a RoBERTa, transformer_lm or transformer checkpoint with fairseq's loader (which also upgrades old
    checkpoints)."""
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    model_args = as_namespace(state["cfg"].model)
    trained_on = state["cfg"].task.data
    # classification heads registered through the hub (not by the task) load too, instead of being dropped
    overrides = {"load_checkpoint_heads": True, **({"data": str(data)} if data is not None else {})}
    overwrite_args_by_name(state["cfg"], overrides)
    family = checkpoint_family(model_args, path)
    try:
        [model], cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)], state=state)
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"{error}\nThe source's task needs its dictionary: pass --data DIR, the data-bin (with dict.txt) the "
            f"checkpoint was trained on (its cfg names {trained_on!r})."
        ) from None
    return Source(model.eval(), task, cfg, model_args, family)


def as_namespace(model_cfg) -> Namespace:
    """A copy of a checkpoint's cfg.model: a Namespace (fairseq-train) or a DictConfig (fairseq-hydra-train)."""
    if OmegaConf.is_config(model_cfg):
        return Namespace(**OmegaConf.to_container(model_cfg, resolve=True, enum_to_str=True))
    return copy.deepcopy(model_cfg)


# ---------------------------------------------------------------------------------------------- target
def target_model_args(source_args: Namespace, model: str, options: Dict[str, object],
                      max_positions: Optional[int] = None) -> Namespace:
    """The source's model args, renamed to our arch (``roberta_large`` -> ``linformer_roberta_large``,
    ``transformer_lm_gpt2_small`` -> ``linear_transformer_lm_gpt2_small``) and with the target's options; the
    shape, dropout and positions stay the source's."""
    family = target_family(model)
    accepted = set(family.option_names(model))
    foreign = sorted(name for name, value in options.items() if value is not None and name not in accepted)
    if foreign:
        raise OptionError(f"options {foreign} do not apply to {model}; it takes {sorted(accepted)}")
    source_positions = getattr(source_args, "max_positions", None)
    if max_positions is not None and max_positions != source_positions:
        raise OptionError(
            f"--max-positions {max_positions} does not match the source's max_positions {source_positions}: the "
            f"learned positional embeddings are copied as they are ({source_positions} positions), and "
            "Linformer's projections are built for that length. Convert with the source's max positions "
            "(drop --max-positions); a different length needs positional embeddings the source never learned."
        )
    args = copy.deepcopy(source_args)
    source_arch = getattr(args, "arch", None) or args._name
    suffixed = model + source_arch[len(family.name):] if source_arch.startswith(family.name) else model
    args.arch = args._name = suffixed if suffixed in ARCH_CONFIG_REGISTRY else model
    for name, value in options.items():
        if value is not None:
            setattr(args, name, value)
    family.check_options(model, args)
    return args


@dataclass
class WarmStart:
    model: PluginModel
    copied: List[str]  # state-dict keys taken from the source
    new: List[str]  # state-dict keys initialised here


def warm_start(source, task, target_args: Namespace, init_projection: str = "default") -> WarmStart:
    """Build our model for ``target_args`` (completed in place with the arch's defaults) and copy every
    shared tensor of ``source`` (a fairseq RoBERTa or transformer_lm) into it."""
    if init_projection not in INIT_PROJECTIONS:
        raise ValueError(f"unknown --init-projection {init_projection!r}; choose one of {INIT_PROJECTIONS}")
    target = build_model(target_args, task)  # fills in the arch's defaults, as fairseq-train does
    for name, head in getattr(source, "classification_heads", {}).items():
        if name not in target.classification_heads:  # heads of the hub or of another task: keep them all
            target.register_classification_head(name, head.out_proj.out_features, head.dense.out_features)
    source_state = source.state_dict()
    new_keys = new_tensor_names(target)
    # fairseq's load_state_dict upgrades the dict it is given in place: hand it a copy
    result = target.load_state_dict(dict(source_state), strict=False)
    unexpected = sorted(result.unexpected_keys)
    uncovered = sorted(set(result.missing_keys) - new_keys)
    if unexpected or uncovered:
        raise RuntimeError(
            "the source and the converted model do not share all the source's weights: "
            f"source tensors with no place in the target {unexpected}, target tensors the source lacks "
            f"{uncovered}. Was the source built with other options than those in its cfg?"
        )
    if init_projection == "identity-like":
        for module in target.modules():
            if isinstance(module, SequenceProjection):
                module.init_identity_like_()
    target.eval()
    return WarmStart(target, copied=[k for k in target.state_dict() if k in source_state],
                     new=sorted(result.missing_keys))


def new_tensor_names(model) -> set:
    """State-dict keys of the parts a softmax source does not have: sequence projections, feature maps, and
    whatever an attention has beside fairseq's q/k/v/out projections (gates, decays, convolution, norms)."""
    names = set()
    for prefix, module in model.named_modules():
        if isinstance(module, (SequenceProjection, FeatureMap)):
            names.update(f"{prefix}.{name}" for name in module.state_dict())
        elif isinstance(module, SelfAttention):
            names.update(f"{prefix}.{name}" for name in module.state_dict() if not name.startswith(FAIRSEQ_PROJECTIONS))
    return names


# ---------------------------------------------------------------------------------------------- checkpoint
def checkpoint_state(target: WarmStart, target_args: Namespace, source: Source, source_path) -> dict:
    """A fairseq checkpoint as the trainer writes one, minus optimizer state: training restarts from it."""
    cfg = OmegaConf.to_container(source.cfg, resolve=True, enum_to_str=True)
    cfg["model"] = target_args
    return {
        "args": None,
        "cfg": cfg,
        "model": target.model.state_dict(),
        "criterion": None,
        # fairseq's loader needs one history record; no last_optimizer_state: nothing to restore
        "optimizer_history": [
            {"criterion_name": None, "optimizer_name": None, "lr_scheduler_state": {}, "num_updates": 0}
        ],
        "task_state": source.task.state_dict(),
        "extra_state": {
            "train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "version": 2},
            "val_loss": None,
            "warm_started_from": str(source_path),
        },
    }


def training_flags(args: Namespace, model: str) -> List[str]:
    """The fairseq-train flags that rebuild this model: the arch, max positions (Linformer's n: an encoder's), and
    every model option (its dataclass's fields, or its add_args's flags) that differs from the arch's defaults."""
    defaults = Namespace()
    ARCH_CONFIG_REGISTRY[args.arch](defaults)
    family = target_family(model)
    flags = ["--arch", args.arch]
    if not family.causal:
        flags += ["--max-positions", str(args.max_positions)]
    config_class = MODEL_DATACLASS_REGISTRY.get(model)
    if config_class is None:  # the model's add_args: its options whose default only the arch sets
        parser = argparse.ArgumentParser(add_help=False)
        family.targets()[model].add_args(parser)
        names = {action.dest: None for action in parser._actions if action.dest != "max_positions"}
    else:  # fields that take their value from the task's (${task.tokens_per_sample}) are the task's flags
        names = {f.name: f.default for f in dataclasses.fields(config_class)
                 if not f.name.startswith("_") and not str(f.default).startswith("${")}
    for name, field_default in names.items():
        value = getattr(args, name, None)
        default = getattr(defaults, name, field_default)
        if value is None or value == default or (default is None and not value):  # unset: 0, False, ""
            continue
        if isinstance(value, bool):  # store_true flags; a False whose default is True has no flag to say it
            flags += ["--" + name.replace("_", "-")] if value else []
        else:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


# ---------------------------------------------------------------------------------------------- conversion
@dataclass
class Conversion:
    output: Path
    model: str
    args: Namespace
    copied: List[str]
    new: List[str]
    new_shapes: Dict[str, tuple]
    copied_numel: int
    agreement: Optional[Agreement] = None
    learned_feature_maps: bool = False  # the attention transfer comes first

    def summary(self) -> str:
        lines = [f"wrote {self.output} ({self.args.arch})",
                 f"copied from the source: {len(self.copied)} tensors ({self.copied_numel:,} values)",
                 f"new ({len(self.new)} tensors):" if self.new else "new: none (every tensor comes from the source)"]
        lines += [f"  {name} {list(shape)}" for name, shape in self.new_shapes.items()]
        if self.agreement is not None:
            a = self.agreement
            lines.append(f"agreement with the source on {a.sample} ({a.tokens} tokens): feature cosine "
                         f"{a.feature_cosine:.4f}, top-1 agreement of the output heads {a.top1:.1%}")
        command = ("fairseq-train DATA --user-dir fairseq_linattn " + " ".join(training_flags(self.args, self.model))
                   + f" --restore-file {self.output} --reset-optimizer --reset-dataloader --reset-meters")
        if self.learned_feature_maps:
            lines.append("attention transfer first (the feature maps learn to reproduce each layer's softmax "
                         f"attention; the rest stays the source's): {command} --criterion attention_transfer ...")
            lines.append("then finetune from its last checkpoint with the task's criterion (examples/linearize)")
        else:
            lines.append(f"continue training with (plus any other model option the source was trained with): "
                         f"{command} ...")
        return "\n".join(lines)


def convert(source_path: str | Path, output_path: str | Path, model: Optional[str] = None,
            options: Optional[Dict[str, object]] = None, data: Optional[str | Path] = None,
            max_positions: Optional[int] = None, init_projection: str = "default", sample_split: str = "valid",
            sample_size: int = 16, seed: int = 1) -> Conversion:
    """Convert the RoBERTa, transformer_lm or transformer checkpoint at ``source_path`` into a ``model`` checkpoint
    (default: the family's, see :data:`FAMILIES`) at ``output_path``."""
    source = load_source(source_path, data)
    model = model or source.family.default_target
    if target_family(model) is not source.family:
        raise OptionError(f"{source_path} is a {source.family.name} model, which converts to "
                         f"{', '.join(source.family.targets())}, not to {model}")
    args = target_model_args(source.model_args, model, options or {}, max_positions)
    torch.manual_seed(seed)  # the new projections / random features
    result = warm_start(source.model, source.task, args, init_projection)
    output = Path(output_path)
    output.parent.mkdir(parents=True, exist_ok=True)
    checkpoint_utils.torch_persistent_save(checkpoint_state(result, args, source, source_path), str(output))

    target_state = result.model.state_dict()
    conversion = Conversion(
        output, model, args, result.copied, result.new,
        new_shapes={name: tuple(target_state[name].shape) for name in result.new},
        copied_numel=sum(target_state[name].numel() for name in result.copied),
        learned_feature_maps=any(isinstance(m, LearnedFeatureMap) for m in result.model.modules()),
    )
    if sample_size > 0:
        length = min(getattr(args, name, None) or 512 for name in ("max_positions", "max_source_positions",
                                                                     "max_target_positions"))
        net_input, sample = sample_batch(source.task, sample_split, sample_size, length, seed)
        conversion.agreement = agreement(source.model, result.model, net_input, source.task.source_dictionary.pad(),
                                         sample, source.family)
    return conversion


__all__ = ["FAMILIES", "Agreement", "Conversion", "Family", "OptionError", "WarmStart", "agreement", "checkpoint_family",
           "convert", "every_target", "sample_batch", "source_family", "target_family", "target_model_args",
           "target_option_names", "warm_start"]
