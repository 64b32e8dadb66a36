"""How close a converted model is to its source on a batch of the task's: final features and top-1 predictions."""
from dataclasses import dataclass
from typing import Dict

import torch
import torch.nn.functional as F

from .families import Family


@dataclass
class Agreement:
    sample: str  # where the tokens came from
    tokens: int
    feature_cosine: float  # mean cosine similarity of the final features, over non-pad tokens
    top1: float  # share of non-pad tokens where both output heads (masked or next token) predict the same token


@torch.no_grad()
def agreement(source, target, net_input: Dict[str, torch.Tensor], pad: int, sample: str, family: Family) -> Agreement:
    """How close ``target`` is to ``source`` on ``net_input`` (a batch of the task's): their final features and their
    output heads' top-1 predictions, at the real (non-pad) positions those have."""
    real = net_input[family.output_tokens].ne(pad)
    source_features, _ = source(**net_input, features_only=True)
    target_features, _ = target(**net_input, features_only=True)
    cosine = F.cosine_similarity(source_features, target_features, dim=-1)[real]
    source_top1 = family.output_layer(source)(source_features).argmax(-1)
    target_top1 = family.output_layer(target)(target_features).argmax(-1)
    same = source_top1.eq(target_top1)[real].float()
    return Agreement(sample, int(real.sum()), cosine.mean().item(), same.mean().item())


def sample_batch(task, split: str, size: int, max_positions: int, seed: int):
    """A batch of the first ``size`` examples of the task's ``split`` (what the models are trained on) as the
    models take it (``net_input``, cut to ``max_positions``), or random tokens when the data-bin has no such split
    (e.g. a dictionary-only folder)."""
    try:
        task.load_dataset(split)
    # masked_lm raises FileNotFoundError for a missing split; sentence_prediction fails an assertion
    except (FileNotFoundError, AssertionError):
        dictionary = task.source_dictionary
        generator = torch.Generator().manual_seed(seed)
        tokens = torch.randint(dictionary.nspecial, len(dictionary), (size, max_positions), generator=generator)
        tokens[:, 0], tokens[:, -1] = dictionary.bos(), dictionary.eos()
        net_input = {"src_tokens": tokens}
        if task.target_dictionary is not None and task.target_dictionary is not dictionary:  # translation
            net_input.update(src_lengths=torch.full((size,), max_positions), prev_output_tokens=tokens.clone())
        return net_input, f"{size} random token sequences (no '{split}' split in the data)"
    dataset = task.dataset(split)
    batch = dataset.collater([dataset[i] for i in range(min(size, len(dataset)))])
    net_input = {name: value[:, :max_positions] if name.endswith("tokens") else value
                 for name, value in batch["net_input"].items() if name in ("src_tokens", "src_lengths",
                                                                             "prev_output_tokens")}
    if "src_lengths" in net_input:
        net_input["src_lengths"] = net_input["src_lengths"].clamp(max=max_positions)
    return net_input, f"{len(batch['id'])} sequences of '{split}'"
