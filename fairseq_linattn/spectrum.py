"""Spectrum of the attention context-mapping matrix: Figure 1 of the Linformer paper (Wang et al. 2020).

    python scripts/attention_spectrum.py checkpoints/checkpoint_best.pt corpus/valid.txt --out spectrum \\
        --data data-bin/corpus --sentencepiece-model data-bin/corpus/sentencepiece.bpe.model

For every layer and head, P = softmax(Q Kᵀ / √d) is computed from the model's own q/k projections applied
to the layer's input (captured with forward hooks on each layer's ``self_attn``, so the encoder runs as
it is). Linformer's argument is that P is low rank: most of the mass of its singular values σ sits in the
first few. The curve per layer and head is the normalised cumulative sum cumsum(σ) / Σσ (σ largest
first), averaged over sequences of n tokens cut from a text file. For ``linformer_roberta`` and
``linear_roberta`` checkpoints P is the full softmax attention their q/k projections define, not the
attention they compute.

Writes into --out: ``spectrum.png`` ((a) the curves, mean over heads per layer with the range over heads
shaded; (b) a layer x head heatmap of the curve at --index), ``spectrum.json`` and ``spectrum.md``.
"""
from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch
from fairseq import checkpoint_utils
from torch import Tensor, nn

from .attention.ops.softmax import softmax_attention_weights
from .data.spm import encode_lines

DEFAULT_LENGTH = 512  # the paper's n


# ---------------------------------------------------------------------------------------------- computation
def self_attention_modules(model) -> List[nn.Module]:
    try:
        layers = model.encoder.sentence_encoder.layers
    except AttributeError:
        raise ValueError(
            f"{type(model).__name__} is not a RoBERTa-style encoder (no encoder.sentence_encoder.layers); the "
            "spectrum takes roberta, linformer_roberta and linear_roberta checkpoints"
        ) from None
    return [layer.self_attn for layer in layers]


@torch.no_grad()
def capture_attention_inputs(model, tokens: Tensor) -> List[Tensor]:
    """Run the encoder once on ``tokens`` (B x T); return each layer's self-attention input (T x B x C)."""
    modules = self_attention_modules(model)
    inputs: Dict[int, Tensor] = {}

    def keep_input(layer):
        def hook(module, args, kwargs, output):
            # fairseq's layers call self_attn(query=x, key=x, value=x, ...)
            inputs[layer] = kwargs["query"] if "query" in kwargs else args[0]

        return hook

    handles = [module.register_forward_hook(keep_input(i), with_kwargs=True) for i, module in enumerate(modules)]
    try:
        model.encoder.extract_features(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return [inputs[i] for i in range(len(modules))]


@torch.no_grad()
def context_mapping_matrices(attention: nn.Module, x: Tensor) -> Tensor:
    """P = softmax(Q Kᵀ / √d) for every head (B x H x T x T) from the module's q/k projections of x (T x B x C).
    Works for fairseq's MultiheadAttention and ours: same projection names, ``scaling`` = 1/√d."""
    def heads(projected: Tensor) -> Tensor:
        t, b, _ = projected.shape
        return projected.view(t, b, attention.num_heads, attention.head_dim).permute(1, 2, 0, 3)

    return softmax_attention_weights(heads(attention.q_proj(x)), heads(attention.k_proj(x)), scale=attention.scaling)


def normalised_cumulative_singular_values(matrices: Tensor) -> Tensor:
    """cumsum(σ) / Σσ of each matrix in a ... x n x n batch, σ largest first: ... x n, rising to 1."""
    sigma = torch.linalg.svdvals(matrices)
    return sigma.cumsum(-1) / sigma.sum(-1, keepdim=True)


@dataclass
class AttentionSpectrum:
    curves: Tensor  # layers x heads x n: cumsum(σ)/Σσ of P, averaged over the sequences
    num_sequences: int

    @property
    def length(self) -> int:
        return self.curves.size(-1)

    def at(self, index: int) -> Tensor:
        """Layers x heads: the share of Σσ in the ``index`` largest singular values (1-based, as the paper)."""
        if not 1 <= index <= self.length:
            raise ValueError(f"--index must be in [1, n={self.length}], got {index}")
        return self.curves[:, :, index - 1]


def attention_spectrum(model, sequences: Tensor, batch_size: int = 8) -> AttentionSpectrum:
    """The averaged spectrum curves of ``model`` (in eval mode) over ``sequences`` (N x n, no padding)."""
    if model.training:
        raise ValueError("call model.eval() first: dropout would perturb the layer inputs")
    modules = self_attention_modules(model)
    total: Optional[Tensor] = None
    for batch in sequences.split(batch_size):
        layer_inputs = capture_attention_inputs(model, batch)
        # one layer at a time: B x H x n x n probabilities for every layer at once would not fit for n = 512
        curves = torch.stack([
            normalised_cumulative_singular_values(context_mapping_matrices(module, x)).sum(0)
            for module, x in zip(modules, layer_inputs)
        ]).double()
        total = curves if total is None else total + curves
    return AttentionSpectrum((total / sequences.size(0)).float(), sequences.size(0))


# ---------------------------------------------------------------------------------------------- inputs
def encode_text(path: str | Path, dictionary, sentencepiece_model: Optional[str | Path] = None) -> Tensor:
    """The non-empty lines of a text file as one token stream (each line ending in </s>, as fairseq
    binarizes them): pieces of ``sentencepiece_model``, or space-separated tokens of the dictionary."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    if not lines:
        raise ValueError(f"{path} has no text")
    if sentencepiece_model is not None:
        lines = encode_lines(sentencepiece_model, lines)
    stream = torch.cat([dictionary.encode_line(line, add_if_not_exist=False, append_eos=True).long()
                        for line in lines])
    unknown = stream.eq(dictionary.unk()).float().mean().item()
    if unknown > 0.5:
        raise ValueError(
            f"{unknown:.0%} of the tokens of {path} are <unk>: the text is not tokenised like the dictionary. "
            "Pass the checkpoint's --sentencepiece-model, or pre-tokenised text matching its dict.txt."
        )
    return stream


def split_sequences(stream: Tensor, length: int, count: int, bos: int) -> Tensor:
    """Up to ``count`` sequences of ``length`` tokens: <s> and the next length - 1 tokens of the stream, as
    RoBERTa's masked_lm blocks are built."""
    body = length - 1
    available = stream.numel() // body
    if available == 0:
        raise ValueError(
            f"the text has {stream.numel()} tokens, one sequence of n={length} needs {body}: give more text "
            "or a smaller --length"
        )
    count = min(count, available)
    sequences = stream[: count * body].view(count, body)
    return torch.cat([torch.full((count, 1), bos, dtype=sequences.dtype), sequences], dim=1)


def load_model(path: str | Path, data: Optional[str | Path] = None):
    """A checkpoint's model (eval mode) and task, with fairseq's loader; ``data`` overrides its data-bin."""
    try:
        [model], _, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(path)], arg_overrides={"data": str(data)} if data is not None else None
        )
    except FileNotFoundError as error:
        raise FileNotFoundError(
            f"{error}\nThe checkpoint's task needs its dictionary: pass --data DIR, the data-bin with the "
            "dict.txt the model was trained with."
        ) from None
    return model.eval(), task


# ---------------------------------------------------------------------------------------------- report
def plot_spectrum(spectrum: AttentionSpectrum, index: int, path: str | Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("the spectrum plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = spectrum.curves.numpy()
    layers, heads, n = curves.shape
    x = range(1, n + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = plt.cm.viridis([i / max(1, layers - 1) for i in range(layers)])
    for layer in range(layers):
        left.plot(x, curves[layer].mean(0), color=colors[layer], label=f"layer {layer}")
        left.fill_between(x, curves[layer].min(0), curves[layer].max(0), color=colors[layer], alpha=0.15)
    left.axvline(index, color="gray", linestyle="--", linewidth=1)
    left.set(xlabel="eigenvalue index", ylabel="normalized cumulative eigenvalue", xlim=(1, n), ylim=(0, 1.02),
             title="(a) cumulative singular values of P (mean over heads)")
    left.legend(fontsize="small", ncol=2 if layers > 6 else 1, loc="lower right")
    image = right.imshow(spectrum.at(index).numpy(), cmap="viridis", aspect="auto", origin="lower")
    right.set(xlabel="head", ylabel="layer", xticks=range(heads), yticks=range(layers),
              title=f"(b) normalized cumulative eigenvalue at index {index}")
    fig.colorbar(image, ax=right)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(spectrum: AttentionSpectrum, index: int, out_dir: str | Path, checkpoint: str,
                 arch: str) -> Dict[str, Path]:
    """spectrum.png, spectrum.json and spectrum.md in ``out_dir``; returns their paths by kind."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n, at_index = spectrum.length, spectrum.at(index)
    setup = f"{arch}, {spectrum.num_sequences} sequences of n={n} tokens"
    paths = {"png": out / "spectrum.png", "json": out / "spectrum.json", "md": out / "spectrum.md"}
    plot_spectrum(spectrum, index, paths["png"], f"{Path(checkpoint).name}: {setup}")

    def rounded(values: Tensor):
        return torch.round(values, decimals=5).tolist()

    paths["json"].write_text(json.dumps({
        "checkpoint": str(checkpoint), "arch": arch, "length": n, "num_sequences": spectrum.num_sequences,
        "index": index,
        "at_index": rounded(at_index),  # layers x heads
        "layer_mean_at_index": rounded(at_index.mean(1)),
        "layer_mean_curves": rounded(spectrum.curves.mean(1)),  # layers x n
    }, indent=1))
    header = "| layer | " + " | ".join(f"head {h}" for h in range(at_index.size(1))) + " | mean |"
    rows = [f"| {layer} | " + " | ".join(f"{v:.3f}" for v in row.tolist()) + f" | {row.mean().item():.3f} |"
            for layer, row in enumerate(at_index)]
    paths["md"].write_text("\n".join([
        f"# Attention spectrum: {checkpoint}",
        "",
        f"{setup}. Share of the singular values of P = softmax(QKᵀ/√d) in the {index} largest "
        f"(cumsum(σ)/Σσ at index {index} of {n}), averaged over sequences; 1.0 = all of it (low rank).",
        "",
        header,
        "|" + "---|" * (at_index.size(1) + 2),
        *rows,
        "",
        "![spectrum](spectrum.png)",
        "",
    ]))
    return paths


def main(argv: Optional[List[str]] = None) -> Dict[str, Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a roberta / linformer_roberta / linear_roberta checkpoint")
    parser.add_argument("text", help="text file, one paragraph or sentence a line")
    parser.add_argument("--out", required=True, help="folder for spectrum.png, spectrum.json, spectrum.md")
    parser.add_argument("--data", help="data-bin with the checkpoint's dict.txt (default: the one its cfg names)")
    parser.add_argument("--sentencepiece-model", help="the checkpoint's sentencepiece model (raw text); without "
                                                      "it the text must be tokenised like dict.txt")
    parser.add_argument("--length", type=int, help=f"n, tokens per sequence (default: min({DEFAULT_LENGTH}, the "
                                                   "model's max positions))")
    parser.add_argument("--num-sequences", type=int, default=32, help="sequences to average over (default 32)")
    parser.add_argument("--index", type=int, help="eigenvalue index of the heatmap (default n/4: 128 for n=512)")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    # as fairseq_cli does: importing fairseq leaves the root logger at DEBUG (its text_to_speech task)
    logging.basicConfig(format="%(levelname)s | %(name)s | %(message)s", level=logging.INFO, force=True)

    model, task = load_model(args.checkpoint, args.data)
    max_positions = model.max_positions()
    length = args.length or min(DEFAULT_LENGTH, max_positions)
    if length > max_positions:
        parser.error(f"--length {length} exceeds the model's max positions {max_positions}")
    dictionary = task.source_dictionary
    stream = encode_text(args.text, dictionary, args.sentencepiece_model)
    sequences = split_sequences(stream, length, args.num_sequences, dictionary.bos())
    spectrum = attention_spectrum(model, sequences, args.batch_size)
    index = args.index or max(1, length // 4)
    paths = write_report(spectrum, index, args.out, args.checkpoint, model.args.arch)
    at_index = spectrum.at(index).mean(1)
    print(f"{spectrum.num_sequences} sequences of n={length}; cumsum(σ)/Σσ at index {index}, mean over heads: "
          + ", ".join(f"layer {i} {v:.3f}" for i, v in enumerate(at_index.tolist())))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return paths


if __name__ == "__main__":
    main()
