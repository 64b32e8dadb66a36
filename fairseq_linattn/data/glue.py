"""GLUE TSVs -> fairseq data-bin for ``--task sentence_prediction``, offline and with sentencepiece.

    python scripts/preprocess_glue.py GLUE_DIR RTE --spm-model data-bin/stdlib/sentencepiece.bpe.model \\
        --dict data-bin/stdlib/dict.txt --out glue-bin
    python scripts/preprocess_glue.py CORPUS_DIR --custom-task cls --input-columns 0 --label-column 1 --header \\
        --spm-model ... --dict ... --out glue-bin

Follows fairseq's examples/roberta/preprocess_GLUE_tasks.sh (same columns, header handling, QQP
filter, MNLI dev/test pairs, STS-B label scaling), with the GPT-2 BPE replaced by a sentencepiece
model and the pretraining dictionary passed in instead of downloaded. For each task it writes
OUT/<TASK>-bin/input0 (and input1 for pair tasks) binarized with that dictionary, and
OUT/<TASK>-bin/label: binarized labels with their own dict.txt, or for a regression task (STS-B)
plain-text floats label/train.label and label/valid.label, which sentence_prediction reads directly.
Splits: train -> train, dev -> valid (MNLI: dev_matched -> valid, dev_mismatched -> valid1),
test -> test (MNLI: test_matched -> test, test_mismatched -> test1; inputs only, like fairseq).
Test files are optional here; train and dev files are required.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from sentencepiece import SentencePieceProcessor

from fairseq_linattn.data import run_fairseq_preprocess
from fairseq_linattn.data.inputs import InputError, MissingInputError
from fairseq_linattn.data.output_folder import staged
from fairseq_linattn.data.spm import encode_lines, load_model

# Share of sentencepiece pieces missing from the dictionary above which the pair (model, dict) is
# almost certainly mismatched, e.g. a dict.txt built with another sentencepiece model.
MAX_OOV_SHARE = 0.05


@dataclass(frozen=True)
class TaskSpec:
    """A task's TSV layout. Columns are 0-based: fairseq's ``cut -f`` numbers minus one."""

    name: str
    input_columns: tuple[int, ...]
    label_column: int
    test_input_columns: tuple[int, ...]
    dev_label_column: int | None = None  # MNLI's dev files keep the gold label in another column
    train_dev_header: bool = True  # CoLA's train/dev files have no header row
    test_header: bool = True  # GLUE test files always have one
    dev_files: tuple[str, ...] = ("dev",)
    test_files: tuple[str, ...] = ("test",)
    num_fields: int | None = None  # QQP: train/dev lines with another field count are dropped, as fairseq does
    regression_scale: float | None = None  # regression: float labels divided by this, written as text
    test_label_column: int | None = None  # a labelled test split (custom tasks): binarized, so fairseq-validate scores it


GLUE_TASKS = {
    spec.name: spec
    for spec in (
        TaskSpec("QQP", (3, 4), 5, (1, 2), num_fields=6),
        TaskSpec("MNLI", (8, 9), 11, (8, 9), dev_label_column=15,
                 dev_files=("dev_matched", "dev_mismatched"), test_files=("test_matched", "test_mismatched")),
        TaskSpec("QNLI", (1, 2), 3, (1, 2)),
        TaskSpec("MRPC", (3, 4), 0, (3, 4)),
        TaskSpec("RTE", (1, 2), 3, (1, 2)),
        TaskSpec("STS-B", (7, 8), 9, (7, 8), regression_scale=5.0),  # scores 0..5 -> 0..1
        TaskSpec("SST-2", (0,), 1, (1,)),
        TaskSpec("CoLA", (3,), 1, (1,), train_dev_header=False),
        TaskSpec("WNLI", (1, 2), 3, (1, 2)),  # not in fairseq's script; same layout as RTE
    )
}
# What fairseq's script means by ALL (it has no WNLI).
ALL_TASKS = ("QQP", "MNLI", "QNLI", "MRPC", "RTE", "STS-B", "SST-2", "CoLA")


class GlueFormatError(InputError):
    """A GLUE file is missing or does not have the expected layout."""


def custom_task_spec(
    name: str,
    input_columns: Sequence[int],
    label_column: int,
    header: bool,
    test_input_columns: Sequence[int] | None = None,
    regression: bool = False,
    test_label_column: int | None = None,
) -> TaskSpec:
    """A task in GLUE layout (NAME/train.tsv, dev.tsv, optional test.tsv) with the given columns; with
    ``test_label_column``, test.tsv's labels are binarized too (``fairseq-validate --valid-subset test``)."""
    if not 1 <= len(input_columns) <= 2:
        raise ValueError(f"a task has one or two input columns, got {list(input_columns)}")
    return TaskSpec(
        name, tuple(input_columns), label_column, tuple(test_input_columns or input_columns),
        train_dev_header=header, test_header=header, regression_scale=1.0 if regression else None,
        test_label_column=test_label_column,
    )


def read_tsv(path: Path, header: bool) -> list[tuple[int, list[str]]]:
    """(line number, fields) per data line, split on tabs only, like ``cut``: GLUE text has stray quotes."""
    text = path.read_bytes().decode("utf-8")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line
    rows = [(number, line.rstrip("\r").split("\t")) for number, line in enumerate(lines, start=1)]
    return rows[1:] if header else rows


def _column(rows: list[tuple[int, list[str]]], column: int, path: Path, spec: TaskSpec, role: str) -> list[str]:
    for number, fields in rows:
        if column >= len(fields):
            raise GlueFormatError(
                f"{path}:{number}: needs column {column} (0-based, the {role}) but the line has "
                f"{len(fields)} tab-separated column(s). Is this the {spec.name} layout? For a custom task fix "
                f"--input-columns/--label-column, and --header if the first line is (or is not) a header."
            )
    return [fields[column] for _, fields in rows]


def _labels(rows: list[tuple[int, list[str]]], column: int, path: Path, spec: TaskSpec) -> list[str]:
    labels = _column(rows, column, path, spec, "label")
    for (number, _), label in zip(rows, labels):
        if spec.regression_scale is not None:
            try:
                float(label)
            except ValueError:
                raise GlueFormatError(f"{path}:{number}: regression label {label!r} is not a number") from None
        elif not label or len(label.split()) != 1:
            raise GlueFormatError(f"{path}:{number}: label {label!r} must be one non-empty token")
    if spec.regression_scale is None:
        return labels
    # format(.., ".6g") prints what fairseq's `awk '{print $1 / 5.0}'` prints.
    return [format(float(label) / spec.regression_scale, ".6g") for label in labels]


def _existing_file(path: Path) -> Path:
    if not path.is_file():
        raise GlueFormatError(f"{path} not found: a GLUE task folder needs train.tsv and dev.tsv (MNLI: "
                              f"dev_matched.tsv, dev_mismatched.tsv), as written by GLUE's download_glue_data.py")
    return path


def _oov_share(encoded: list[str], dictionary_words: set[str]) -> float:
    pieces = [piece for line in encoded for piece in line.split()]
    return sum(piece not in dictionary_words for piece in pieces) / max(len(pieces), 1)


def _write_lines(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def prepare_task(spec: TaskSpec, glue_dir: Path, out_dir: Path, processor: SentencePieceProcessor, srcdict: Path,
                 work_dir: Path, workers: int) -> list[list[str]]:
    """Encode the task's inputs and labels into work_dir (regression labels go straight to
    OUT/<TASK>-bin/label) and return the fairseq-preprocess invocations that binarize them."""
    task_dir = glue_dir / spec.name
    if not task_dir.is_dir():
        raise GlueFormatError(f"task folder not found: {task_dir} (expected GLUE_DIR/{spec.name}/train.tsv, dev.tsv)")
    work_dir.mkdir(parents=True)

    test_paths = [task_dir / f"{stem}.tsv" for stem in spec.test_files]
    test_paths = test_paths if all(p.is_file() for p in test_paths) else []
    if not test_paths:
        print(f"[{spec.name}] no {', '.join(s + '.tsv' for s in spec.test_files)}: writing train and valid only")
    # (kind, path, header, input columns, label column or None)
    splits = [("train", _existing_file(task_dir / "train.tsv"), spec.train_dev_header, spec.input_columns,
               spec.label_column)]
    splits += [("valid", _existing_file(task_dir / f"{stem}.tsv"), spec.train_dev_header, spec.input_columns,
                spec.dev_label_column if spec.dev_label_column is not None else spec.label_column)
               for stem in spec.dev_files]
    splits += [("test", path, spec.test_header, spec.test_input_columns, spec.test_label_column) for path in test_paths]
    if spec.test_label_column is not None and not test_paths:
        raise GlueFormatError(f"--test-label-column given but {task_dir / 'test.tsv'} does not exist: add the labelled "
                              "test split or drop the option")

    dictionary_words = {line.split(" ")[0] for line in srcdict.read_text(encoding="utf-8").splitlines()}
    prefixes: dict[str, dict[str, list[str]]] = {}  # "input0"/"label" -> kind -> file prefixes
    for kind, path, header, input_columns, label_column in splits:
        rows = read_tsv(path, header)
        if spec.num_fields is not None and kind != "test":
            rows = [(n, fields) for n, fields in rows if len(fields) == spec.num_fields]
        if not rows:  # fairseq-preprocess would binarize an empty split, and training fail on it much later
            raise GlueFormatError(
                f"{path} has no examples: it is empty{' or holds only its header row' if header else ''}"
                f"{f' (or no line with {spec.num_fields} tab-separated fields)' if spec.num_fields else ''}")
        stem = path.stem
        for i, column in enumerate(input_columns):
            encoded = encode_lines(processor, _column(rows, column, path, spec, f"input{i}"))
            oov_share = _oov_share(encoded, dictionary_words) if kind == "train" else 0.0
            if oov_share > MAX_OOV_SHARE:
                print(f"[{spec.name}] warning: {oov_share:.0%} of the pieces of {path} are not in {srcdict}; "
                      "were the dictionary and the sentencepiece model made together?", file=sys.stderr)
            prefixes.setdefault(f"input{i}", {}).setdefault(kind, []).append(
                _write_lines(work_dir / f"{stem}.input{i}", encoded))
        if label_column is not None:
            labels = _labels(rows, label_column, path, spec)
            prefixes.setdefault("label", {}).setdefault(kind, []).append(
                _write_lines(work_dir / f"{stem}.label", labels))
        print(f"[{spec.name}] {path.name}: {len(rows)} examples")

    bin_dir = out_dir / f"{spec.name}-bin"
    shutil.rmtree(bin_dir, ignore_errors=True)  # like fairseq's `rm -rf $TASK-bin`: no stale splits
    invocations = []
    for name, by_kind in prefixes.items():
        if name == "label" and spec.regression_scale is not None:
            # sentence_prediction reads regression targets from label/<split>.label as text.
            (bin_dir / "label").mkdir(parents=True)
            tests = by_kind.get("test", [])
            names = ["train", *_valid_names(len(by_kind["valid"])),
                     *(valid.replace("valid", "test") for valid in _valid_names(len(tests)))]
            for split_name, source in zip(names, by_kind["train"] + by_kind["valid"] + tests):
                shutil.copyfile(source, bin_dir / "label" / f"{split_name}.label")
            continue
        args = ["--only-source", "--destdir", str(bin_dir / name), "--workers", str(workers),
                "--trainpref", by_kind["train"][0], "--validpref", ",".join(by_kind["valid"])]
        if "test" in by_kind:
            args += ["--testpref", ",".join(by_kind["test"])]
        if name != "label":  # inputs share the pretraining dictionary; labels get their own
            args += ["--srcdict", str(srcdict)]
        invocations.append(args)
    return invocations


def _valid_names(count: int) -> list[str]:
    """fairseq-preprocess's names for comma-separated --validpref files: valid, valid1, valid2, ..."""
    return ["valid"] + [f"valid{k}" for k in range(1, count)]


def preprocess_glue(glue_dir: str | Path, tasks: Sequence[TaskSpec], out_dir: str | Path,
                    spm_model: str | Path, srcdict: str | Path, workers: int = 2) -> list[Path]:
    """Binarize each task into OUT/<TASK>-bin (see the module docstring); returns those folders."""
    glue_dir, out_dir, srcdict = Path(glue_dir), Path(out_dir), Path(srcdict)
    if not glue_dir.is_dir():
        raise GlueFormatError(f"GLUE data folder not found: {glue_dir}")
    if not srcdict.is_file():
        raise MissingInputError(f"dictionary not found: {srcdict} (the pretraining data-bin's dict.txt)")
    processor = load_model(spm_model)
    # every task's <TASK>-bin or none, and an old one replaced only by a whole new one (:mod:`.output_folder`)
    with staged(out_dir) as staging, tempfile.TemporaryDirectory(prefix="glue-encoded-") as work_dir:
        invocations = []
        for spec in tasks:
            invocations += prepare_task(spec, glue_dir, staging, processor, srcdict, Path(work_dir) / spec.name,
                                        workers)
        # Each invocation already runs `workers` processes: keep the total near the CPU count.
        run_fairseq_preprocess(*invocations, parallel=max(1, (os.cpu_count() or 1) // workers))
    return [out_dir / f"{spec.name}-bin" for spec in tasks]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("glue_dir", type=Path, help="folder with one sub-folder per task, e.g. glue_data/RTE/")
    parser.add_argument("task", nargs="?", help=f"one of {', '.join(GLUE_TASKS)}, or ALL ({' '.join(ALL_TASKS)})")
    parser.add_argument("--spm-model", type=Path, required=True, help="sentencepiece model used for pretraining")
    parser.add_argument("--dict", type=Path, required=True, help="the pretraining dictionary (data-bin dict.txt)")
    parser.add_argument("--out", type=Path, default=Path("."), help="writes OUT/<TASK>-bin (default: .)")
    parser.add_argument("--workers", type=int, default=2)
    custom = parser.add_argument_group("custom task (instead of TASK): GLUE_DIR/NAME/{train,dev[,test]}.tsv")
    custom.add_argument("--custom-task", metavar="NAME")
    custom.add_argument("--input-columns", type=int, nargs="+", help="0-based column(s) of the input text(s)")
    custom.add_argument("--label-column", type=int, help="0-based column of the label")
    custom.add_argument("--test-input-columns", type=int, nargs="+", help="default: --input-columns")
    custom.add_argument("--test-label-column", type=int, help="0-based column of test.tsv's labels: a labelled test "
                        "split is binarized with them, for fairseq-validate --valid-subset test (default: "
                        "unlabelled, as GLUE's)")
    custom.add_argument("--header", action="store_true", help="every file starts with a header row")
    custom.add_argument("--regression", action="store_true", help="float labels, written as text like STS-B")
    args = parser.parse_intermixed_args(argv)  # TASK may come after the options

    if (args.task is None) == (args.custom_task is None):
        parser.error("give either TASK or --custom-task NAME")
    if args.custom_task is not None:
        if args.input_columns is None or args.label_column is None:
            parser.error("--custom-task needs --input-columns and --label-column")
        tasks = [custom_task_spec(args.custom_task, args.input_columns, args.label_column, args.header,
                                  args.test_input_columns, args.regression, args.test_label_column)]
    elif args.task == "ALL":
        tasks = [GLUE_TASKS[name] for name in ALL_TASKS]
    elif args.task in GLUE_TASKS:
        tasks = [GLUE_TASKS[args.task]]
    else:
        parser.error(f"unknown task {args.task!r}: one of {', '.join(GLUE_TASKS)}, ALL, or use --custom-task")
    try:
        for bin_dir in preprocess_glue(args.glue_dir, tasks, args.out, args.spm_model, args.dict, args.workers):
            print(f"wrote {bin_dir}")
    except InputError as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
