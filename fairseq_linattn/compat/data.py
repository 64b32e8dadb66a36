"""fairseq's data handling, made to say when nothing is left to evaluate.

* numpy 2 removed ``np.compat``; two fairseq data modules still spell ``np.compat.long`` (LM datasets with
  ``--sample-break-mode eos``, language-pair datasets) and would fail with AttributeError.
* When every sample is longer than the model accepts, fairseq skipped them all: ``fairseq-eval-lm`` then
  printed "Evaluated 0 tokens ... Perplexity: 1.00" and exited 0, and ``--skip-invalid-size-inputs-valid-test``
  crashed with an IndexError in ``batch_by_size``. Both are now an error that names the options to change.
  A caller that deals with too-long samples itself (:data:`ON_TOO_LONG`: fairseq-interactive skips the line and
  reads the next) gets them instead, without fairseq's exception or warning. These two apply to runs of our models,
  tasks and criteria (:mod:`.scope`); fairseq's own keep fairseq's outcome unless ``FAIRSEQ_LINATTN_ALL_MODELS=1``.
"""
import contextvars
import types

import numpy

from . import scope


class Numpy2CompatNumpy(types.ModuleType):
    """Stands in for ``numpy`` in the fairseq modules that spell ``np.compat.long`` (it was ``int``)."""

    compat = types.SimpleNamespace(long=int)

    def __getattr__(self, name):
        return getattr(numpy, name)


class NothingToEvaluateError(ValueError):
    pass


LENGTH_OPTIONS = (
    "raise the length the model is given (--tokens-per-sample / --max-positions / --max-target-positions, "
    "within what the model was trained with), cut the data into shorter samples (--sample-break-mode none "
    "or complete instead of eos, --shorten-method truncate), or, for fairseq-eval-lm, evaluate with "
    "--context-window"
)


def shorter_samples(max_positions) -> str:
    """What to do when every sample is longer than ``max_positions`` (an int, or a tuple with one per input): make
    them shorter. The model's limit was fixed by its training: a larger --tokens-per-sample only makes longer ones."""
    limits = [m for m in (max_positions if isinstance(max_positions, (tuple, list)) else (max_positions,))
              if isinstance(m, int)]
    if not limits:
        return LENGTH_OPTIONS
    return (f"make the samples at most {min(limits)} tokens, the model's limit since it was trained (e.g. "
            f"--tokens-per-sample {min(limits)} or less: a larger value only makes longer samples), cut them "
            f"(--sample-break-mode none or complete instead of eos, --shorten-method truncate), or, for "
            f"fairseq-eval-lm, evaluate with --context-window")


# Set by a caller that handles samples longer than the model accepts itself: ``on_too_long(dataset, ignored,
# max_positions)`` gets their indices, and filtering neither raises nor warns. fairseq-interactive skips such a line
# with its own warning; a data set (eval-lm, validate, generate) keeps the refusal below.
ON_TOO_LONG = contextvars.ContextVar("fairseq_linattn_on_too_long", default=None)


def refusing_to_filter_everything(filter_indices_by_size):
    """Wraps ``FairseqTask.filter_indices_by_size``: dropping every sample is an error, not a warning."""

    def filter_indices(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        on_too_long = ON_TOO_LONG.get()
        if on_too_long is not None:
            kept, ignored = dataset.filter_indices_by_size(indices, max_positions)
            if len(ignored) > 0:
                on_too_long(dataset, ignored, max_positions)
            return kept
        kept = filter_indices_by_size(self, indices, dataset, max_positions, ignore_invalid_inputs)
        if len(indices) > 0 and len(kept) == 0 and scope.applies():
            raise NothingToEvaluateError(
                f"all {len(indices):,} samples are longer than the model accepts (max_positions={max_positions}), "
                f"so none is left: {shorter_samples(max_positions)}."
            )
        return kept

    filter_indices.__wrapped__ = filter_indices_by_size
    return filter_indices


def refusing_zero_tokens(eval_lm):
    """Wraps ``fairseq_cli.eval_lm.eval_lm``: a perplexity over zero tokens (fairseq reports 1.00) is an error."""

    def counted(batches, count):
        for sample in batches:
            count[0] += int(sample.get("ntokens", 0)) if sample else 0
            yield sample

    def evaluate(*args, **kwargs):
        count = [0]
        if "batch_iterator" in kwargs:
            kwargs["batch_iterator"] = counted(kwargs["batch_iterator"], count)
        else:
            args = (*args[:2], counted(args[2], count), *args[3:])
        results = eval_lm(*args, **kwargs)
        models = kwargs["models"] if "models" in kwargs else args[0]
        # (every worker: a worker's shard may be empty while others are not)
        if scope.applies(models=models) and _total_over_workers(count[0]) == 0:
            raise NothingToEvaluateError(f"fairseq-eval-lm evaluated 0 tokens (the subset is empty): {LENGTH_OPTIONS}.")
        return results

    evaluate.__wrapped__ = eval_lm
    return evaluate


def _total_over_workers(count: int) -> int:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return count
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    total = torch.tensor([count], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    return int(total)


def apply():
    from fairseq.tasks import FairseqTask

    if not hasattr(numpy, "compat"):
        from fairseq.data import language_pair_dataset, token_block_dataset

        for module in (token_block_dataset, language_pair_dataset):
            module.np = Numpy2CompatNumpy("numpy")
    FairseqTask.filter_indices_by_size = refusing_to_filter_everything(FairseqTask.filter_indices_by_size)
    import fairseq_cli.eval_lm

    fairseq_cli.eval_lm.eval_lm = refusing_zero_tokens(fairseq_cli.eval_lm.eval_lm)
