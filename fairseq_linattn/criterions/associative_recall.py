"""``--criterion associative_recall``: cross-entropy and accuracy at the asked positions of
``--task associative_recall`` and at the answer of ``--task needle_retrieval`` (every other target is padding,
which fairseq's cross-entropy ignores)."""
import torch
from fairseq import metrics
from fairseq.criterions import register_criterion
from fairseq.criterions.cross_entropy import CrossEntropyCriterion, CrossEntropyCriterionConfig


@register_criterion("associative_recall", dataclass=CrossEntropyCriterionConfig)
class AssociativeRecallCriterion(CrossEntropyCriterion):
    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        loss, _ = self.compute_loss(model, net_output, sample, reduce=reduce)
        target = model.get_targets(sample, net_output)
        asked = target.ne(self.padding_idx)
        with torch.no_grad():
            correct = (net_output[0].argmax(-1).eq(target) & asked).sum()
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        return loss, sample_size, {"loss": loss.data, "ntokens": sample["ntokens"], "sample_size": sample_size,
                                   "nsentences": sample["target"].size(0), "n_correct": correct.item(),
                                   "n_asked": int(asked.sum())}

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        CrossEntropyCriterion.reduce_metrics(logging_outputs)
        asked = sum(log.get("n_asked", 0) for log in logging_outputs)
        if asked:
            correct = sum(log.get("n_correct", 0) for log in logging_outputs)
            metrics.log_scalar("accuracy", 100.0 * correct / asked, asked, round=2)
