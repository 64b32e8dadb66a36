"""linformer_roberta built the way fairseq builds it (arch defaults on a Namespace or a DictConfig)."""
import pytest
import torch
from omegaconf import OmegaConf

from fairseq_linattn.attention import LinformerAttention
from fairseq_linattn.models.linformer_roberta import LinformerRobertaModel

from .builders import SMALL_ENCODER, FakeTask, build


def linformer(**overrides):
    return build("linformer_roberta_base", **{**SMALL_ENCODER, **overrides})


def attentions(model):
    return [m for m in model.modules() if isinstance(m, LinformerAttention)]


def projection_count(model):
    distinct = {id(a.projection_k) for a in attentions(model)} | {id(a.projection_v) for a in attentions(model)}
    return len(distinct)


@pytest.mark.parametrize(
    "flags, expected", [({}, 24), ({"shared_kv_compressed": 1}, 12), ({"shared_layer_kv_compressed": 1}, 1)]
)
def test_distinct_projections_per_sharing_mode(flags, expected):
    model, _ = linformer(encoder_layers=12, **flags)
    assert projection_count(model) == expected
    stored = [k for k in model.state_dict() if "compress" in k]
    assert len(stored) == expected, stored  # stored once, no per-layer copies


def test_layerwise_sharing_leaves_no_parameter_without_gradient():
    model, task = linformer(shared_layer_kv_compressed=1)
    tokens = torch.randint(4, len(task.dictionary), (2, 20))
    out, _ = model(tokens)
    out.sum().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == []


def test_freeze_compress():
    model, _ = linformer(freeze_compress=1)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all("compress" in n for n in frozen)


def test_per_layer_compressed_length_and_ratio():
    model, _ = linformer(encoder_layers=3, compressed_length="32,16,8")
    assert [a.projection_k.compressed_length for a in attentions(model)] == [32, 16, 8]
    model, _ = linformer(encoder_layers=3, compressed="2,4,8")
    assert [a.projection_k.compressed_length for a in attentions(model)] == [32, 16, 8]
    with pytest.raises(ValueError, match="3 layers"):
        linformer(encoder_layers=3, compressed="2,4")
    with pytest.raises(ValueError, match="same k"):
        linformer(encoder_layers=3, compressed="2,4,8", shared_layer_kv_compressed=1)


@pytest.mark.parametrize("projection", ["learned", "mean", "max", "conv"])
def test_real_token_features_unchanged_by_padding(projection):
    model, task = linformer(encoder_layers=4, compress_projection=projection, compressed=4)
    model.eval()
    pad = task.dictionary.pad()
    a = torch.randint(4, len(task.dictionary), (1, 13))
    b = torch.randint(4, len(task.dictionary), (1, 64))
    batch = torch.full((2, 64), pad)
    batch[0, :13] = a[0]
    batch[1] = b[0]
    with torch.no_grad():
        alone, _ = model(a, features_only=True)
        padded, _ = model(batch, features_only=True)
    rel = (padded[0, :13] - alone[0]).norm() / alone[0].norm()
    assert rel < 1e-5


def test_too_long_input_error_names_limit_and_flag():
    model, _ = linformer()
    with pytest.raises(ValueError, match=r"at most 64 \(--max-positions"):
        model(torch.randint(4, 30, (1, 65)))


def test_activation_checkpointing_is_kept():
    model, task = linformer(checkpoint_activations=True)
    layer = model.encoder.sentence_encoder.layers[0]
    assert hasattr(layer, "precheckpoint_forward")  # fairseq's checkpoint_wrapper marker
    tokens = torch.randint(4, len(task.dictionary), (2, 20))
    model.train()
    out, _ = model(tokens)
    out.float().sum().backward()
    assert layer.self_attn.compress_k.weight.grad is not None


def test_state_dict_round_trip_and_max_positions_mismatch():
    model, task = linformer()
    clone, _ = linformer()
    clone.load_state_dict(model.state_dict())
    tokens = torch.randint(4, len(task.dictionary), (2, 20))
    model.eval(), clone.eval()
    torch.testing.assert_close(model(tokens)[0], clone(tokens)[0])

    longer, _ = linformer(max_positions=128)
    state = model.state_dict()
    with pytest.raises(ValueError, match="--max-positions 64"):
        longer.upgrade_state_dict(state)


def test_options_are_read_from_a_hydra_dictconfig():
    """fairseq-hydra-train hands build_model a DictConfig; plugin options must survive (upstream loses them)."""
    cfg = OmegaConf.create({**SMALL_ENCODER, "_name": "linformer_roberta", "compressed": 8, "shared_kv_compressed": 1,
                            "compress_projection": "mean"})
    from fairseq.models import ARCH_CONFIG_REGISTRY

    OmegaConf.set_struct(cfg, False)
    ARCH_CONFIG_REGISTRY["linformer_roberta"](cfg)
    model = LinformerRobertaModel.build_model(cfg, FakeTask())
    attn = attentions(model)
    assert [a.projection_k.compressed_length for a in attn] == [8, 8]
    assert all(a.shared_kv and a.projection_k.kind == "mean" for a in attn)


def test_large_arch_sizes():
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = Namespace()
    ARCH_CONFIG_REGISTRY["linformer_roberta_large"](args)
    assert (args.encoder_layers, args.encoder_embed_dim, args.compressed) == (24, 1024, 4)
