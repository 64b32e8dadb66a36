"""The kinds of fairseq softmax model that convert (RoBERTa, transformer_lm, transformer) and our models of each."""
import argparse
from argparse import Namespace
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Type

from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq.models.roberta import RobertaModel
from fairseq.models.transformer import TransformerModel
from fairseq.models.transformer_lm import TransformerLanguageModel

from ..models.linear_transformer import LinearTransformerModel, attention_roles
from ..models.plugin_model import PluginModel
from ..models.roberta import SwappedAttentionRobertaModel  # the package import registers every model
from ..models.transformer_lm import SwappedAttentionLanguageModel


class OptionError(ValueError):
    """The options asked for cannot describe a target model: the user's to fix (the command line says it in one
    line)."""


@dataclass(frozen=True)
class Family:
    """A kind of fairseq softmax model that converts, and our models of that kind."""

    name: str  # its arch prefix: roberta_large -> <target>_large
    source_class: Type
    target_class: Type  # our models of the family subclass it
    default_target: str
    causal: bool  # the attention options are a decoder's
    output_layer: Callable  # model -> its module from the final features to the vocabulary's logits
    output_tokens: str = "src_tokens"  # the net_input entry whose positions the output layer predicts at
    role_options: Optional[Callable] = None  # parser -> adds a target's options besides its attention's
    check_roles: Optional[Callable] = None  # model args -> checks every role's options (ValueError: a mistake)

    def targets(self) -> Dict[str, Type]:
        """Every registered model of this family with another attention, so that a model added later is a target
        too. Read when asked, after every model has registered."""
        return {name: model for name, model in sorted(MODEL_REGISTRY.items()) if issubclass(model, self.target_class)}

    def add_options(self, model: str, parser):
        self.targets()[model].attention_stack().options_class.add_args(parser, causal=self.causal)
        if self.role_options is not None:
            self.role_options(parser)

    def check_options(self, model: str, args: Namespace):
        """The target's options, checked as the model will check them when it is built: an OptionError names the
        mistake (at start-up, before any weight is read)."""
        try:
            if self.check_roles is not None:  # the roles' options, each checked by its own options class
                self.check_roles(args)
            else:
                self.targets()[model].attention_stack().options_class.from_args(args)
        except ValueError as error:
            raise OptionError(str(error)) from None

    def option_names(self, model: str) -> List[str]:
        """The options ``model`` adds to the source's (its attention's), taken from the model itself."""
        parser = argparse.ArgumentParser(add_help=False)
        self.add_options(model, parser)
        return [action.dest for action in parser._actions]


FAMILIES = (
    Family("roberta", RobertaModel, SwappedAttentionRobertaModel, "linformer_roberta", causal=False,
           output_layer=lambda model: model.encoder.output_layer),
    Family("transformer_lm", TransformerLanguageModel, SwappedAttentionLanguageModel, "linear_transformer_lm",
           causal=True, output_layer=lambda model: model.decoder.output_layer),
    Family("transformer", TransformerModel, LinearTransformerModel, "linear_transformer", causal=True,
           output_layer=lambda model: model.decoder.output_layer, output_tokens="prev_output_tokens",
           role_options=LinearTransformerModel.add_role_args, check_roles=attention_roles),
)


def target_family(model: str) -> Family:
    for family in FAMILIES:
        if model in family.targets():
            return family
    raise ValueError(f"unknown target model {model!r}; choose one of {sorted(every_target())}")


def every_target() -> Dict[str, Type]:
    return {name: cls for family in FAMILIES for name, cls in family.targets().items()}


def source_family(model_class: Optional[Type]) -> Optional[Family]:
    """The family of a checkpoint's model class: a fairseq softmax model (not one of ours) of a known kind."""
    if model_class is None or issubclass(model_class, PluginModel):
        return None
    return next((family for family in FAMILIES if issubclass(model_class, family.source_class)), None)


def checkpoint_family(model_cfg, path) -> Family:
    """The family of the checkpoint at ``path`` whose saved model config is ``model_cfg``; an OptionError if it is
    not a kind that converts."""
    arch = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None)
    family = source_family(ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch))
    if family is None:
        raise OptionError(
            f"{path} holds a {arch!r} model; the warm start converts fairseq's RoBERTa checkpoints (arch roberta, "
            "roberta_base, roberta_large or another arch of the 'roberta' model), transformer_lm and transformer ones"
        )
    return family


def target_option_names(model: str) -> List[str]:
    """The options ``model`` adds to the source's (its attention's), taken from the model itself."""
    return target_family(model).option_names(model)
