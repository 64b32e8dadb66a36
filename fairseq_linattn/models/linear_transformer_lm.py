"""``linear_transformer_lm``: fairseq's transformer_lm with kernelized causal linear attention
(Katharopoulos et al. 2020, "Transformers are RNNs").

Training runs the chunked causal op (linear time and memory in the length); generation runs each layer as
an RNN with a constant-size state (S, z) kept in fairseq's ``incremental_state``, so fairseq-generate,
beam search (``reorder_incremental_state``), fairseq-interactive and the hub's ``sample()`` work unchanged.
"""
from dataclasses import dataclass, field

from fairseq.models import register_model, register_model_architecture
from fairseq.models import transformer_lm as fairseq_lm
from fairseq.models.transformer_lm import DEFAULT_MAX_TARGET_POSITIONS, TransformerLanguageModel
from fairseq.utils import safe_getattr

from ..attention import KernelOptions
from .checkpoint_fit import ChecksCheckpointFit
from .layers import SwappedAttentionDecoder


def _kernel_field(name: str):
    flag = KernelOptions.FLAGS[name]
    return field(default=flag.default, metadata={"help": flag.help})


@dataclass
class LinearTransformerLanguageModelConfig(fairseq_lm.TransformerLanguageModelConfig):
    # the kernel attention options; their defaults and meaning live in KernelOptions
    feature_map: str = _kernel_field("feature_map")
    chunk_size: int = _kernel_field("chunk_size")
    favor_features: int = _kernel_field("favor_features")
    favor_redraw_interval: int = _kernel_field("favor_redraw_interval")
    favor_seed: int = _kernel_field("favor_seed")


class LinearTransformerDecoder(SwappedAttentionDecoder):
    """fairseq's TransformerDecoder whose self-attention is causal kernelized linear attention."""

    options_class = KernelOptions

    def extract_features(self, prev_output_tokens, *args, **kwargs):
        if prev_output_tokens.size(1) == 0:  # nothing to attend to; fairseq's sinusoidal positions cannot reshape 0 tokens
            x = self.embed_tokens.weight.new_zeros(prev_output_tokens.size(0), 0, self.output_embed_dim)
            return x, {"attn": [None], "inner_states": [x.transpose(0, 1)]}
        return super().extract_features(prev_output_tokens, *args, **kwargs)

    def buffered_future_mask(self, tensor):
        # Causality is a property of the attention itself. fairseq's mask is an n x n tensor (1 GB at
        # n = 16384), which would make training memory quadratic again.
        return None


@register_model("linear_transformer_lm", dataclass=LinearTransformerLanguageModelConfig)
class LinearTransformerLanguageModel(ChecksCheckpointFit, TransformerLanguageModel):
    @classmethod
    def attention_stack(cls):
        return LinearTransformerDecoder

    @classmethod
    def build_model(cls, args, task):
        for unsupported in ("character_embeddings", "adaptive_input"):
            if safe_getattr(args, unsupported, False):
                raise NotImplementedError(f"linear_transformer_lm does not support --{unsupported.replace('_', '-')}")
        if safe_getattr(args, "decoder_layers_to_keep", None):
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        return cls(LinearTransformerDecoder(args, task.target_dictionary, embed_tokens))

    @classmethod
    def from_pretrained(cls, model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".",
                        bpe="sentencepiece", **kwargs):
        """fairseq's hub loader (``sample()``, ``score()``), sentencepiece by default (no BPE download)."""
        return super().from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, bpe=bpe, **kwargs)


# transformer_lm's sizes, one for one: each of our archs applies fairseq's arch function of the same size.
# (The plain name linear_transformer_lm uses the dataclass defaults: 6 x 512, like transformer_lm.)
for _ours, _theirs in {
    "linear_transformer_lm_big": fairseq_lm.transformer_lm_big,
    "linear_transformer_lm_gpt": fairseq_lm.transformer_lm_gpt,
    "linear_transformer_lm_gpt2_tiny": fairseq_lm.transformer_lm_gpt2_tiny,
    "linear_transformer_lm_gpt2_small": fairseq_lm.transformer_lm_gpt2_small,
    "linear_transformer_lm_gpt2_medium": fairseq_lm.transformer_lm_gpt2_medium,
}.items():
    register_model_architecture("linear_transformer_lm", _ours)(lambda args, same_size=_theirs: same_size(args))
