"""--task associative_recall: the MQAR lines (Zoology's form), made the same from the same seed, batched by length,
and scored at the asked positions only; its options checked when the command line is parsed."""
import sys
from argparse import Namespace

import numpy as np
import pytest
import torch
from fairseq import options

from fairseq_linattn.criterions.associative_recall import AssociativeRecallCriterion
from fairseq_linattn.tasks.associative_recall import AssociativeRecallConfig, AssociativeRecallTask
from fairseq_linattn.tasks.mqar import IGNORED, Shape, mqar_example, power_law
from tests.compat.test_cli_checks import CHECKPOINT, parse_error


def task(**overrides) -> AssociativeRecallTask:
    return AssociativeRecallTask.setup_task(AssociativeRecallConfig(**{"train_lines": 64, "valid_lines": 16,
                                                                      **overrides}))


@pytest.mark.parametrize("shape", [Shape(64, 4), Shape(256, 32), Shape(128, 32)])
def test_a_line_holds_the_pairs_then_asks_each_key_once(shape):
    tokens, targets = mqar_example(np.random.default_rng(0), shape, num_keys=128, num_values=128, power_a=0.01)
    assert tokens.shape == targets.shape == (shape.length,)
    context = 2 * shape.pairs
    keys, values = tokens[0:context:2], tokens[1:context:2]
    assert len(set(keys)) == len(set(values)) == shape.pairs
    assert keys.max() < 128 <= values.min() and values.max() < 256 and tokens.min() >= 0 and tokens.max() < 256
    asked = np.flatnonzero(targets != IGNORED)
    assert len(asked) == shape.pairs and asked.min() >= context and np.all((asked - context) % 2 == 0)
    assert sorted(tokens[asked]) == sorted(keys)  # each key asked once
    pairs = dict(zip(keys, values))
    assert all(targets[i] == pairs[tokens[i]] for i in asked)  # the target is the asked key's value


def test_asked_offsets_follow_the_power_law():
    space = 100
    offsets = [np.flatnonzero(mqar_example(np.random.default_rng(i), Shape(2 * 4 + 2 * space, 4), 128, 128,
                                           0.01)[1] != IGNORED) for i in range(200)]
    short = np.mean([((o - 8) // 2 < 10).mean() for o in offsets])
    uniform = np.mean([((o - 8) // 2 < 10).mean() for o in (
        np.flatnonzero(mqar_example(np.random.default_rng(i), Shape(2 * 4 + 2 * space, 4), 128, 128, 1.0)[1] != IGNORED)
        for i in range(200))])
    assert power_law(space, 1.0) == pytest.approx(np.full(space, 1 / space))
    assert short > 0.4 and uniform < 0.2  # a = 0.01 puts many more asked keys near the start of the region


def test_the_same_seed_makes_the_same_lines_and_another_split_other_lines():
    t = task()
    for split in ("train", "valid", "L128_P8"):
        t.load_dataset(split)
    again = task()
    again.load_dataset("train")
    assert all(torch.equal(t.dataset("train")[i]["source"], again.dataset("train")[i]["source"]) for i in range(8))
    assert not torch.equal(t.dataset("train")[0]["source"], t.dataset("valid")[0]["source"])
    assert {len(t.dataset("L128_P8")[i]["source"]) for i in range(4)} == {128}
    other_seed = task(recall_seed=2)
    other_seed.load_dataset("train")
    assert not torch.equal(t.dataset("train")[0]["source"], other_seed.dataset("train")[0]["source"])


def test_training_mixes_the_shapes_and_batches_keep_one_length():
    t = task(train_shapes="64:4,128:8")
    t.load_dataset("train")
    data = t.dataset("train")
    assert [len(data[i]["source"]) for i in range(4)] == [64, 128, 64, 128]
    order = data.ordered_indices()
    assert sorted(order.tolist()) == list(range(len(data))) and list(data.sizes[order]) == sorted(data.sizes)
    batch = data.collater([data[0], data[1]])
    pad = t.dictionary.pad()
    assert batch["net_input"]["src_tokens"].shape == (2, 128) and batch["net_input"]["src_lengths"].tolist() == [64, 128]
    assert batch["net_input"]["src_tokens"][0, 64:].eq(pad).all()  # right-padded
    assert batch["ntokens"] == 4 + 8 == int(batch["target"].ne(pad).sum())  # the asked positions only


class Oracle(torch.nn.Module):
    """A "model" that predicts the value of the asked key, or (``wrong``) the next symbol."""

    def __init__(self, answers, wrong=False):
        super().__init__()
        self.answers, self.wrong = answers, wrong

    def forward(self, src_tokens, src_lengths):
        logits = torch.zeros(*src_tokens.shape, 264)
        best = self.answers.clamp(min=0) + (1 if self.wrong else 0)
        return logits.scatter(-1, best.unsqueeze(-1), 10.0), None

    def get_normalized_probs(self, net_output, log_probs):
        return torch.log_softmax(net_output[0], -1)

    def get_targets(self, sample, net_output):
        return sample["target"]


def test_the_criterion_scores_the_asked_positions_only():
    t = task(train_shapes="64:4,128:8")
    t.load_dataset("train")
    sample = t.dataset("train").collater([t.dataset("train")[i] for i in range(4)])
    criterion = AssociativeRecallCriterion(t, sentence_avg=False)
    answers = torch.where(sample["target"].ne(t.dictionary.pad()), sample["target"], torch.zeros_like(sample["target"]))
    for wrong, accuracy in ((False, 100.0), (True, 0.0)):
        loss, size, log = criterion(Oracle(answers, wrong), sample)
        assert size == log["n_asked"] == sample["ntokens"] == 24
        assert log["n_correct"] == accuracy / 100 * 24
    from fairseq import metrics

    with metrics.aggregate() as agg:
        AssociativeRecallCriterion.reduce_metrics([{**log, "n_correct": 6}, {**log, "n_correct": 18}])
    assert agg.get_smoothed_values()["accuracy"] == 50.0


@pytest.mark.parametrize("flags,message", [
    (["--criterion", "cross_entropy"], "use --criterion associative_recall, not cross_entropy"),
    (["--train-shapes", "64:40"], "--train-shapes: 64:40 is too short"),
    (["--valid-shapes", "256:200"], "asks for 200 distinct keys but there are 128"),
    (["--valid-subset", "valid,L2048_P8"], "the split L2048_P8: lines of 2048 tokens are longer than --tokens-per-sample"),
    (["--train-shapes", "64-4"], "--train-shapes takes length:pairs"),
    (["--power-a", "0"], "--power-a must be in (0, 1]"),
])
def test_mistakes_are_one_line_when_the_command_line_is_parsed(monkeypatch, capsys, flags, message):
    argv = ["fairseq-train", "--task", "associative_recall", "--criterion", "associative_recall", "--arch",
            "linear_transformer_lm", *flags]
    line = parse_error(monkeypatch, capsys, options.get_training_parser, *argv)
    assert line.startswith("fairseq-train: error: ") and message in line, line


def test_validate_takes_the_checkpoints_criterion(monkeypatch):
    """fairseq-validate builds the criterion the checkpoint saved: its default --criterion is not a mistake."""
    monkeypatch.setattr(sys, "argv", ["fairseq-validate", "--task", "associative_recall", "--path", CHECKPOINT,
                                      "--valid-subset", "L512_P64"])
    args = options.parse_args_and_arch(options.get_validation_parser())
    assert args.task == "associative_recall" and isinstance(args, Namespace)
