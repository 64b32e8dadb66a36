"""fairseq's command lines run from Python, and what is read back from their logs: the pieces the main job
(``scripts/main_job.py``) and the quality benchmark (:mod:`.quality`) share.

Everything goes through the real console scripts (``fairseq-train``, ``fairseq-validate``,
``fairseq-eval-lm``) of the running interpreter's environment, with ``--user-dir`` pointing at this plugin.
"""
import math
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_linattn.attention.recurrent_state import linear_attentions
from fairseq_linattn.cli import forkserver

USER_DIR = Path(__file__).resolve().parents[2] / "fairseq_linattn"  # the plugin's package folder

BIN = Path(sys.executable).parent

# the lines of fairseq's output echoed while a command runs (the whole log is kept in a file)
PROGRESS = re.compile(r"train_inner|valid on|\| train \||done training|Loaded checkpoint|num. shared|"
                      r"num. model params|ERROR|Error|Traceback")


class FairseqError(SystemExit):
    """A fairseq command failed: the message names the command, its exit code, the log file and its end."""


def say(msg: str, prefix: str = "run"):
    print(f"[{prefix} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gdn2_starts() -> Dict[str, List[str]]:
    """gdn2 with each --gdn2-start but the default (fairseq_linattn/attention/mechanisms/gdn2.py says what each ties):
    {"gdn2-<start>-start": its options}, the benchmarks' model names."""
    gdn2 = linear_attentions()["gdn2"]
    return {f"gdn2-{start}-start": ["--linear-attention", "gdn2", "--gdn2-start", start]
            for start in gdn2.STARTS if start != gdn2.DEFAULT_START}


def ffn_for_parameters(count: Callable[[int], int], target: int, wide: int) -> int:
    """The FFN width at which a model has ``target`` parameters, ``count(ffn)`` being its count at FFN width ``ffn``
    (linear in it: each layer's two FFN matrices and biases), measured at ``wide`` and half of it: how the studies
    pay for a mechanism's own projections (gates, decays, convolution) with a narrower FFN."""
    narrow = wide // 2
    at_wide = count(wide)
    per_unit = (at_wide - count(narrow)) / (wide - narrow)
    return max(1, round(wide - (at_wide - target) / per_unit))


def fairseq(command: str, *args, log: Path, echo: Optional[re.Pattern] = PROGRESS, env: Optional[Dict] = None) -> str:
    """Run a fairseq console script, echo the lines ``echo`` matches, keep the whole output in ``log`` and
    return it; a failure raises :class:`FairseqError` with the log's end."""
    cmd = [str(BIN / command), *map(str, args)]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin's safe loader does the loading
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    server = forkserver.shared(full_env)
    lines = []

    def keep(line):
        lines.append(line)
        if echo is not None and echo.search(line):
            print("   " + line.rstrip()[-160:], flush=True)

    if server is not None:  # FAIRSEQ_LINATTN_FORK_COMMANDS=1: forked, its lines echoed when it is done
        returncode = server.run(cmd, command=command, env=full_env, cwd=os.getcwd(), log=log)
        for line in Path(log).read_text(errors="replace").splitlines(keepends=True):
            keep(line)
    else:  # the log is written as the command runs (tail -f it to follow a long run)
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env) as proc, \
                open(log, "w") as out:
            try:
                for line in proc.stdout:
                    keep(line)
                    out.write(line)
                    out.flush()
            except BaseException:  # interrupted: the command must not go on writing a log a later call reads
                proc.kill()
                raise
        returncode = proc.returncode
    if returncode != 0:
        raise FairseqError(f"{command} failed (exit {returncode}); full log: {log}\n{''.join(lines[-30:])}")
    return "".join(lines)


def last(pattern: str, text: str, cast=float):
    """The last match of ``pattern``'s group in ``text`` (a fairseq log), cast; an error if there is none."""
    found = re.findall(pattern, text)
    if not found:
        raise FairseqError(f"could not find {pattern!r} in fairseq's output")
    return cast(found[-1])


def valid_curve(log: str, metric: str = "loss") -> List[Tuple[int, float]]:
    """(num_updates, validation ``metric``) at each validation of a fairseq-train log."""
    found = re.findall(rf"valid on 'valid' subset .*?\| {metric} ([0-9.]+) .*?num_updates (\d+)", log)
    return [(int(updates), float(value)) for value, updates in found]


def train_curve(log: str) -> List[Tuple[int, float]]:
    """(num_updates, training loss averaged over the logging interval) at each of fairseq-train's
    ``train_inner`` lines (every ``--log-interval`` updates)."""
    found = re.findall(r"train_inner \|.*? loss=([0-9.]+), .*?num_updates=(\d+)", log)
    return [(int(updates), float(value)) for value, updates in found]


def train_seconds(log: str) -> float:
    """fairseq-train's own count of its training time."""
    return last(r"done training in ([0-9.]+) seconds", log)


def parameter_count(log: str) -> int:
    """The model's parameters, as fairseq-train reports them."""
    return last(r"num. shared model params: ([0-9,]+)", log, lambda x: int(x.replace(",", "")))


def seconds_per_update(log: str) -> float:
    """Median time of an update, 1 / fairseq's ``ups`` (updates per second over each ``train_inner``
    interval, measured to the hundredth; its ``wall`` counters are whole seconds). The median leaves out the
    intervals that hold a validation or the start-up."""
    rates = sorted(float(ups) for ups in re.findall(r"train_inner \|.*?, ups=([0-9.]+)", log) if float(ups) > 0)
    if not rates:
        return float("nan")
    return 1.0 / rates[len(rates) // 2]


# ---------------------------------------------------------------------------------------------- baselines
def split_tokens(data_bin: Path, split: str):
    """Every token of a binarized split, in order (sentences with their end-of-sentence symbol)."""
    import numpy as np
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(Path(data_bin) / "dict.txt"))
    dataset = data_utils.load_indexed_dataset(str(Path(data_bin) / split), dictionary)
    if dataset is None:
        raise FileNotFoundError(f"no binarized split {split!r} in {data_bin}")
    return np.concatenate([dataset[i].numpy() for i in range(len(dataset))]), len(dictionary)


def unigram_perplexity(data_bin: Path, split: str = "test") -> float:
    """The perplexity on ``split`` of a model that ignores context: token frequencies counted on ``train``
    (add-one smoothed over the dictionary). A model that learned nothing but frequencies reaches it; the
    ratio of a model's perplexity to it says how much it learned from context."""
    import numpy as np

    train, size = split_tokens(data_bin, "train")
    evaluated, _ = split_tokens(data_bin, split)
    counts = np.bincount(train, minlength=size).astype(np.float64) + 1.0
    return float(math.exp(-np.log(counts[evaluated] / counts.sum()).mean()))


# ---------------------------------------------------------------------------------------------- by position
WORD_PROBS = re.compile(r"fairseq_cli\.eval_lm(?: \| |:)(\d+) (.*)$")  # "INFO:fairseq_cli.eval_lm:7 ▁the [-2.1]\t..."


def positional_log_probs(log: str) -> Dict[int, List[float]]:
    """sample id -> the log-probability (natural log) of each token fairseq-eval-lm scored, in order, from its
    ``--output-word-probs`` lines (run without ``--remove-bpe``, so one entry per token)."""
    samples = {}
    for line in log.splitlines():
        found = WORD_PROBS.search(line)
        if found:
            samples[int(found.group(1))] = [float(item.rsplit(" [", 1)[1].rstrip("]"))
                                            for item in found.group(2).split("\t")]
    if not samples:
        raise FairseqError("fairseq-eval-lm printed no word probabilities (was --output-word-probs given?)")
    return samples


def perplexity_by_position(samples: Dict[int, List[float]], block: int, period: int, buckets: int) -> List[float]:
    """Perplexity in ``buckets`` equal ranges of positions ``[0, period)``, where the token ``j`` of sample ``i``
    stands at position ``(i * block + j) % period`` of the stream (fairseq's ``--sample-break-mode none`` cuts
    the stream into samples of ``block`` tokens, in id order)."""
    total, count = defaultdict(float), defaultdict(int)
    width = period / buckets
    for sample_id, log_probs in samples.items():
        if len(log_probs) > block:
            raise ValueError(f"sample {sample_id} has {len(log_probs)} scored tokens, more than its block of {block}")
        for j, log_prob in enumerate(log_probs):
            bucket = int(((sample_id * block + j) % period) // width)
            total[bucket] += log_prob
            count[bucket] += 1
    return [math.exp(-total[b] / count[b]) if count[b] else float("nan") for b in range(buckets)]


# ---------------------------------------------------------------------------------------------- data
@dataclass
class CorpusData:
    """The embedded corpus, binarized: ``lm`` for masked_lm and language_modeling, ``cls`` for
    sentence_prediction (what does a docstring document?), with the corpus summary."""

    lm: Path
    cls: Path
    summary: object

    @property
    def classes(self) -> int:
        """The classification task's label count (its label dictionary, fairseq-preprocess's padding left out)."""
        words = (Path(self.cls) / "label" / "dict.txt").read_text(encoding="utf-8").split("\n")
        return sum(1 for line in words if line.strip() and not line.startswith("madeupword"))

    @property
    def majority_baseline(self) -> Optional[float]:
        """Accuracy (%) of always answering the most frequent class of the dev set."""
        counts = self.summary.classification.get("dev") or {}
        return round(100 * max(counts.values()) / sum(counts.values()), 1) if counts else None


def prepare_corpus(work: Path, max_chars: int, vocab: int, workers: int = 2) -> CorpusData:
    """Corpus -> sentencepiece -> fairseq-preprocess, for the LM tasks and the classification task."""
    from fairseq_linattn.data.glue import custom_task_spec, preprocess_glue
    from fairseq_linattn.data.lm_data import prepare_lm_data
    from fairseq_linattn.data.stdlib_corpus import build_corpus

    corpus = Path(work) / "corpus"
    summary = build_corpus(corpus, max_chars=max_chars)
    lm = prepare_lm_data(corpus / "train.txt", corpus / "valid.txt", Path(work) / "data-bin", test=corpus / "test.txt",
                         vocab_size=vocab, workers=workers)
    spec = custom_task_spec("cls", input_columns=[0], label_column=1, header=True)
    (cls,) = preprocess_glue(corpus, [spec], Path(work) / "glue", lm / "sentencepiece.bpe.model", lm / "dict.txt",
                             workers=workers)
    return CorpusData(lm=lm, cls=cls, summary=summary)


def prepare_debian(work: Path, vocab: int, workers: int = 2) -> CorpusData:
    """The second classification task (Debian package descriptions -> their Section, from this machine's apt lists;
    fairseq_linattn.data.debian_packages): its descriptions for masked_lm, its labelled splits for
    sentence_prediction (test labels binarized too)."""
    from types import SimpleNamespace

    from fairseq_linattn.data.debian_packages import extract
    from fairseq_linattn.data.glue import custom_task_spec, preprocess_glue
    from fairseq_linattn.data.lm_data import prepare_lm_data

    raw = Path(work) / "debian"
    summary = extract(raw)
    corpus = raw / "corpus"
    lm = prepare_lm_data(corpus / "train.txt", corpus / "valid.txt", Path(work) / "data-bin", test=corpus / "test.txt",
                         vocab_size=vocab, workers=workers)
    spec = custom_task_spec("cls", input_columns=[0], label_column=1, header=True, test_label_column=1)
    (cls,) = preprocess_glue(raw, [spec], Path(work) / "glue", lm / "sentencepiece.bpe.model", lm / "dict.txt",
                             workers=workers)
    return CorpusData(lm=lm, cls=cls, summary=SimpleNamespace(**summary))


def sequence(*parts: Sequence) -> List[str]:
    return [str(p) for part in parts for p in part]
