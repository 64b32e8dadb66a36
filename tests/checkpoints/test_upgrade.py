"""Options whose meaning changed, read from an older checkpoint as that version read them (checkpoints.upgrade)."""
from argparse import Namespace

import pytest
import torch
from omegaconf import OmegaConf

from fairseq_linattn.checkpoints import IncompatibleCheckpointError, upgrade_checkpoint_options


def state(linear_attention, layers_with_conv, short_conv=4, output_gate=1, layers=2, namespace=False):
    model = {"decoder.embed_tokens.weight": torch.zeros(1)}
    for i in range(layers):
        model[f"decoder.layers.{i}.self_attn.q_proj.weight"] = torch.zeros(1)
        if i in layers_with_conv:
            model[f"decoder.layers.{i}.self_attn.conv.weight"] = torch.zeros(1)
            model[f"decoder.layers.{i}.self_attn.gate_proj.weight"] = torch.zeros(1)
    options = dict(linear_attention=linear_attention, short_conv=short_conv, output_gate=output_gate)
    model_cfg = Namespace(**options) if namespace else options
    return {"cfg": OmegaConf.create({"model": model_cfg}, flags={"allow_objects": True}), "model": model}


@pytest.mark.parametrize("namespace", [False, True], ids=["dictconfig", "namespace"])
@pytest.mark.parametrize("linear_attention,with_conv", [("kernel", []), ("elu", []), ("kernel,gated-delta", [1])])
def test_kernel_layers_saved_without_them_get_the_mechanisms_default(linear_attention, with_conv, namespace):
    """An old checkpoint stored --short-conv 4 --output-gate 1 (then the defaults, which kernel attention ignored):
    read back as the mechanism's default, which builds no convolution and no gate for kernel layers."""
    upgraded = upgrade_checkpoint_options(state(linear_attention, with_conv, namespace=namespace))
    model_cfg = upgraded["cfg"].model
    assert (model_cfg.short_conv, model_cfg.output_gate) == (None, None)


@pytest.mark.parametrize("linear_attention,with_conv", [("kernel", [0, 1]), ("gated-delta", [0, 1]),
                                                         ("gated-delta", [])])
def test_checkpoints_trained_as_saved_are_left_alone(linear_attention, with_conv):
    """A kernel model trained with them (this version), and every checkpoint with no kernel layer, stay as saved."""
    upgraded = upgrade_checkpoint_options(state(linear_attention, with_conv, short_conv=3))
    assert (upgraded["cfg"].model.short_conv, upgraded["cfg"].model.output_gate) == (3, 1)


def test_an_old_layout_that_cannot_be_described_is_refused_by_name():
    with pytest.raises(IncompatibleCheckpointError, match="--short-conv 2.*fairseq_linattn 0.1"):
        upgrade_checkpoint_options(state("kernel,gated-delta", [1], short_conv=2), "old.pt")


def test_other_checkpoints_pass_through():
    roberta = {"cfg": OmegaConf.create({"model": {"arch": "roberta_base"}}), "model": {"x": torch.zeros(1)}}
    assert upgrade_checkpoint_options(roberta) is roberta and "short_conv" not in roberta["cfg"].model
    assert upgrade_checkpoint_options({"cfg": None, "model": {}}) == {"cfg": None, "model": {}}


@pytest.mark.parametrize("saved,expected", [
    (dict(linear_attention="elu"), ("kernel", "kernel", "elu")),  # 0.1: no --encoder-attention at all
    (dict(linear_attention="kernel", encoder_attention=None, cross_attention="kernel"), ("kernel", "kernel", "kernel")),
    (dict(linear_attention="gated-delta", encoder_attention="softmax", cross_attention="softmax"),
     ("softmax", "softmax", "gated-delta")),  # saved with every role: as saved
], ids=["0.1", "a role unsaved", "all saved"])
def test_a_translation_checkpoint_without_its_roles_is_kernel_in_them(saved, expected):
    """Before 0.3 linear_transformer's roles defaulted to kernel attention; a checkpoint that saved no value for one
    is read with kernel there, not with today's defaults (softmax encoder and cross-attention, gated-delta decoder)."""
    ckpt = {"cfg": OmegaConf.create({"model": {"arch": "linear_transformer_tiny", **saved}}),
            "model": {"decoder.layers.0.self_attn.q_proj.weight": torch.zeros(1)}}
    model_cfg = upgrade_checkpoint_options(ckpt)["cfg"].model
    assert (model_cfg.encoder_attention, model_cfg.cross_attention, model_cfg.linear_attention) == expected


def test_restoring_compares_an_old_checkpoint_as_it_was_trained():
    """--restore-file and --model-overrides compare identities through saved_model_cfg: the 0.1 translation
    checkpoint is kernel in every role there too."""
    from fairseq_linattn.checkpoints.fit import model_class, saved_model_cfg
    from tests.pages import ROOT

    saved = saved_model_cfg(str(ROOT / "tests" / "checkpoints" / "v0_1" / "linear_transformer.pt"))
    identity = model_class(saved).identity(saved)
    assert (identity["--encoder-attention"], identity["--linear-attention"], identity["--cross-attention"]) == (
        "kernel", "kernel", "kernel")
