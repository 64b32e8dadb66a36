"""``--criterion attention_transfer``: train a kernel attention to reproduce softmax attention, layer by layer.

The first step of converting a trained softmax model (LoLCATs' attention transfer, Hedgehog's distillation): every
kernel attention of the model computes, beside its own output, what softmax attention over the same q, k, v
projections gives (no gradient), and the loss is the mean squared difference, summed over the layers. Only the
feature maps train (``--transfer-params feature-maps``, the default: learned maps such as ``--feature-map hedgehog``
or ``t2r``; every other weight is frozen, so the teacher stays the model's own projections), or everything
(``all``). The task's own loss is logged beside it (``task_loss``, not trained on: base 2 per target that is not
padding, as fairseq's cross-entropy and masked-LM criteria log theirs), so that the transfer can be watched from
the start. A finetune with the task's criterion follows.
"""
import math
from dataclasses import dataclass, field

import torch
from fairseq import metrics, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from ..attention.feature_maps import FEATURE_MAPS, FeatureMap, LearnedFeatureMap
from ..attention.kernel import KernelAttention

TRANSFER_PARAMS = ("feature-maps", "all")
NO_WEIGHTS = ("the feature map has no weights to train; use a learned one (--feature-map hedgehog or t2r) or "
              "--transfer-params all")


def startup_problem(options, transfer_params: str):
    """The command line's check (compat.cli): training only the feature maps of a map without weights."""
    feature_map = getattr(options, "feature_map", None)
    if transfer_params == "feature-maps" and feature_map is not None and not issubclass(FEATURE_MAPS[feature_map],
                                                                                          LearnedFeatureMap):
        return f"--criterion attention_transfer --transfer-params feature-maps: {NO_WEIGHTS}"
    return None


@dataclass
class AttentionTransferConfig(FairseqDataclass):
    transfer_params: str = field(default="feature-maps", metadata={
        "help": "what trains: feature-maps (the learned feature maps' weights; the rest is the frozen teacher) or all"})


@register_criterion("attention_transfer", dataclass=AttentionTransferConfig)
class AttentionTransferCriterion(FairseqCriterion):
    def __init__(self, task, transfer_params="feature-maps"):
        super().__init__(task)
        if transfer_params not in TRANSFER_PARAMS:
            raise ValueError(f"--transfer-params {transfer_params!r}: choose one of {', '.join(TRANSFER_PARAMS)}")
        self.transfer_params = transfer_params
        self._frozen = False

    def layers(self, model):
        layers = [m for m in model.modules() if isinstance(m, KernelAttention)]
        if not layers:
            raise ValueError(f"--criterion attention_transfer needs kernel attention layers, and {type(model).__name__} "
                             "has none: train linear_roberta, linear_transformer_lm (--linear-attention kernel) or "
                             "linear_transformer")
        return layers

    def freeze(self, model, layers):
        """Once: every weight but the feature maps' stops training (feature-maps), and the maps must have some."""
        if self.transfer_params == "feature-maps":
            learned = {id(p) for layer in layers for m in layer.modules() if isinstance(m, FeatureMap)
                       for p in m.parameters()}
            if not learned:
                raise ValueError(f"--transfer-params feature-maps: {NO_WEIGHTS}")
            for p in model.parameters():
                p.requires_grad_(id(p) in learned)
        self._frozen = True

    def forward(self, model, sample, reduce=True):
        layers = self.layers(model)
        if not self._frozen:
            self.freeze(model, layers)
        for layer in layers:
            layer.transfer, layer.transfer_loss = True, None
        try:
            net_output = model(**sample["net_input"])
        finally:
            for layer in layers:
                layer.transfer = False
        losses = [layer.transfer_loss for layer in layers if layer.transfer_loss is not None]
        loss = torch.stack(losses).sum()
        with torch.no_grad():  # the task's own loss, for the log
            lprobs = model.get_normalized_probs(net_output, log_probs=True)
            target = model.get_targets(sample, net_output)
            task_loss = torch.nn.functional.nll_loss(lprobs.reshape(-1, lprobs.size(-1)).float(), target.reshape(-1),
                                                     ignore_index=self.padding_idx, reduction="sum")
        # the targets the task's loss is over: a masked LM's are its masked positions, not sample["ntokens"] (a
        # tensor: counted on the device, read once per log by reduce_metrics, not once per step)
        targets = target.ne(self.padding_idx).sum()
        return loss, 1, {"loss": loss.data, "task_loss": task_loss.data, "targets": targets,
                         "ntokens": sample["ntokens"], "nsentences": sample["target"].size(0), "sample_size": 1,
                         "layers": len(losses)}

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        batches = len(logging_outputs)
        metrics.log_scalar("loss", sum(log.get("loss", 0) for log in logging_outputs) / max(1, batches), batches,
                           round=6)
        targets = utils.item(sum(log.get("targets", 0) for log in logging_outputs))
        if targets:
            metrics.log_scalar("task_loss", sum(log.get("task_loss", 0) for log in logging_outputs) / targets
                               / math.log(2), targets, round=3)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return False  # the loss is a mean over batches
