"""fairseq_linattn.data.glue (scripts/preprocess_glue.py) on GLUE-layout files built from real stdlib docstrings.

One module-wide run binarizes RTE- and STS-B-style tasks plus the corpus's own classification task (a
custom column spec, single sentence) with the real fairseq-preprocess; other layouts (SST-2, CoLA, QQP,
MNLI) are checked up to the fairseq-preprocess arguments, since each binarization costs seconds of imports.
"""
import shutil
from pathlib import Path

import pytest

from fairseq_linattn.data.spm import load_model

TRAIN, DEV, TEST = 120, 40, 20  # examples per split: small, fairseq-preprocess start-up dominates anyway


def _write_tsv(path: Path, rows: list[list[str]], header: list[str] | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (["\t".join(header)] if header else []) + ["\t".join(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _word_overlap_score(a: str, b: str) -> str:
    """A 0..5 similarity from the two texts (Jaccard of their word sets), written like STS-B's scores."""
    words_a, words_b = set(a.lower().split()), set(b.lower().split())
    return f"{5 * len(words_a & words_b) / len(words_a | words_b):.3f}"


def _build_glue_dir(root: Path, corpus) -> dict[str, dict[str, list]]:
    """Write SST-2/CoLA/RTE/STS-B-style folders and a copy of the corpus's cls task; returns what was written."""
    docs = corpus.classification["train"][: TRAIN + DEV + TEST]
    pairs = corpus.pairs["train"][: TRAIN + DEV + TEST]
    parts = {"train": slice(0, TRAIN), "dev": slice(TRAIN, TRAIN + DEV), "test": slice(TRAIN + DEV, None)}
    written = {}
    for split, part in parts.items():
        single = [(sentence, "1" if kind == "function" else "0") for sentence, kind in docs[part]]
        pair = pairs[part]
        if split == "test":  # GLUE test files: an index column, no labels
            _write_tsv(root / "SST-2" / "test.tsv", [[str(i), s] for i, (s, _) in enumerate(single)], ["index", "sentence"])
            _write_tsv(root / "CoLA" / "test.tsv", [[str(i), s] for i, (s, _) in enumerate(single)], ["index", "sentence"])
            _write_tsv(root / "RTE" / "test.tsv", [[str(i), a, b] for i, (a, b, _) in enumerate(pair)],
                       ["index", "sentence1", "sentence2"])
            _write_tsv(root / "STS-B" / "test.tsv",
                       [[str(i), "main-docs", "stdlib", "2024", str(i), "none", "none", a, b]
                        for i, (a, b, _) in enumerate(pair)],
                       ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"])
            written[split] = {"single": single, "pair": pair}
            continue
        _write_tsv(root / "SST-2" / f"{split}.tsv", [[s, label] for s, label in single], ["sentence", "label"])
        _write_tsv(root / "CoLA" / f"{split}.tsv", [["stdlib", label, "", s] for s, label in single], None)
        rte_labels = {"1": "entailment", "0": "not_entailment"}
        _write_tsv(root / "RTE" / f"{split}.tsv",
                   [[str(i), a, b, rte_labels[label]] for i, (a, b, label) in enumerate(pair)],
                   ["index", "sentence1", "sentence2", "label"])
        scores = [_word_overlap_score(a, b) for a, b, _ in pair]
        _write_tsv(root / "STS-B" / f"{split}.tsv",
                   [[str(i), "main-docs", "stdlib", "2024", str(i), "none", "none", a, b, score]
                    for i, ((a, b, _), score) in enumerate(zip(pair, scores))],
                   ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
                    "score"])
        written[split] = {"single": single, "pair": pair, "scores": scores}
    return written


@pytest.fixture(scope="module")
def glue(tmp_path_factory, corpus, corpus_dir, spm_model, lm_databin, preprocess_glue_script):
    glue_dir = tmp_path_factory.mktemp("glue")
    written = _build_glue_dir(glue_dir, corpus)
    shutil.copytree(corpus_dir / "cls", glue_dir / "cls")
    g = preprocess_glue_script
    tasks = [g.GLUE_TASKS["RTE"], g.GLUE_TASKS["STS-B"]]
    tasks.append(g.custom_task_spec("cls", input_columns=[0], label_column=1, header=True))
    out = tmp_path_factory.mktemp("glue-bin")
    bins = g.preprocess_glue(glue_dir, tasks, out, spm_model, lm_databin / "dict.txt", workers=1)
    assert bins == [out / f"{name}-bin" for name in ("RTE", "STS-B", "cls")]
    return {"dir": glue_dir, "out": out, "written": written, "dict": lm_databin / "dict.txt"}


def _dataset(path: Path):
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(path.parent / "dict.txt"))
    return dictionary, data_utils.load_indexed_dataset(str(path), dictionary)


@pytest.mark.parametrize("task,inputs,splits", [
    ("RTE", 2, {"train": TRAIN, "valid": DEV, "test": TEST}),
    ("STS-B", 2, {"train": TRAIN, "valid": DEV, "test": TEST}),
    ("cls", 1, None),  # no test.tsv; sizes from the corpus
])
def test_inputs_are_binarized_with_the_pretraining_dictionary(glue, corpus, task, inputs, splits):
    splits = splits or {"train": len(corpus.classification["train"]), "valid": len(corpus.classification["dev"])}
    bin_dir = glue["out"] / f"{task}-bin"
    assert sorted(p.name for p in bin_dir.iterdir()) == [f"input{i}" for i in range(inputs)] + ["label"]
    for i in range(inputs):
        input_dir = bin_dir / f"input{i}"
        assert (input_dir / "dict.txt").read_bytes() == glue["dict"].read_bytes()
        for split, count in splits.items():
            assert (input_dir / f"{split}.bin").is_file() and (input_dir / f"{split}.idx").is_file()
            assert len(_dataset(input_dir / split)[1]) == count
        assert "test" in splits or not (input_dir / "test.bin").exists()


def test_inputs_decode_back_to_the_sentences(glue, spm_model):
    dictionary, dataset = _dataset(glue["out"] / "RTE-bin" / "input1" / "valid")
    normalize = load_model(spm_model).normalize
    expected = [normalize(b).replace("\u2581", " ").strip() for _, b, _ in glue["written"]["dev"]["pair"]]
    decoded = [dictionary.string(dataset[i], bpe_symbol="sentencepiece") for i in range(len(dataset))]
    known = [(d, e) for d, e in zip(decoded, expected) if "<unk>" not in d]
    assert len(known) > len(decoded) // 2
    assert all(d == e for d, e in known)


@pytest.mark.parametrize("task,labels", [
    ("RTE", lambda glue, corpus, split: [
        "entailment" if label == "1" else "not_entailment" for *_, label in glue["written"][split]["pair"]]),
    ("cls", lambda glue, corpus, split: [label for _, label in corpus.classification[split]]),
])
def test_labels_have_their_own_dictionary_and_keep_their_order(glue, corpus, task, labels):
    label_dir = glue["out"] / f"{task}-bin" / "label"
    for split, glue_split in (("train", "train"), ("valid", "dev")):
        dictionary, dataset = _dataset(label_dir / split)
        expected = labels(glue, corpus, glue_split)
        assert [dictionary.string(dataset[i][:-1]) for i in range(len(dataset))] == expected
        symbols = {dictionary[i] for i in range(dictionary.nspecial, len(dictionary))}
        assert {s for s in symbols if not s.startswith("madeupword")} == set(expected)
    assert not (label_dir / "test.bin").exists()


def test_stsb_labels_are_scaled_float_text(glue):
    label_dir = glue["out"] / "STS-B-bin" / "label"
    assert sorted(p.name for p in label_dir.iterdir()) == ["train.label", "valid.label"]
    for split, glue_split in (("train", "train"), ("valid", "dev")):
        values = (label_dir / f"{split}.label").read_text().splitlines()
        assert values == [format(float(s) / 5.0, ".6g") for s in glue["written"][glue_split]["scores"]]
        assert all(0.0 <= float(v) <= 1.0 for v in values)


def test_binarized_tasks_load_in_sentence_prediction(glue, corpus):
    from fairseq.tasks.sentence_prediction import SentencePredictionConfig, SentencePredictionTask

    for task, regression in (("cls", False), ("RTE", False), ("STS-B", True)):
        config = SentencePredictionConfig(data=str(glue["out"] / f"{task}-bin"), num_classes=1 if regression else 3,
                                          regression_target=regression, classification_head_name="head", seed=1)
        loaded = SentencePredictionTask.setup_task(config)
        loaded.load_dataset("valid")
        expected = len(corpus.classification["dev"]) if task == "cls" else DEV
        assert len(loaded.datasets["valid"]) == expected


@pytest.mark.parametrize("task", ["SST-2", "CoLA"])
def test_single_sentence_layouts(glue, spm_model, lm_databin, preprocess_glue_script, tmp_path, task):
    """SST-2: header rows, test sentence in column 1. CoLA: no header in train/dev (but in test), sentence in column 3."""
    g = preprocess_glue_script
    processor = load_model(spm_model)
    invocations = g.prepare_task(g.GLUE_TASKS[task], glue["dir"], tmp_path / "out", processor,
                                 lm_databin / "dict.txt", tmp_path / "work", workers=1)
    for stem, count in (("train", TRAIN), ("dev", DEV), ("test", TEST)):
        sentences = [s for s, _ in glue["written"][stem]["single"]]
        encoded = (tmp_path / "work" / f"{stem}.input0").read_text(encoding="utf-8").splitlines()
        assert len(sentences) == count and encoded == [" ".join(processor.encode(s, out_type=str)) for s in sentences]
    expected = [label for _, label in glue["written"]["dev"]["single"]]
    assert (tmp_path / "work" / "dev.label").read_text().splitlines() == expected
    assert [args[args.index("--destdir") + 1] for args in invocations] == [
        str(tmp_path / "out" / f"{task}-bin" / name) for name in ("input0", "label")]


def test_a_missing_column_names_the_file_line_and_fix(tmp_path, spm_model, lm_databin, preprocess_glue_script):
    g = preprocess_glue_script
    _write_tsv(tmp_path / "RTE" / "train.tsv", [["0", "first sentence", "second sentence", "entailment"]],
               ["index", "sentence1", "sentence2", "label"])
    _write_tsv(tmp_path / "RTE" / "dev.tsv", [["0", "first", "second", "entailment"], ["1", "only one sentence"]],
               ["index", "sentence1", "sentence2", "label"])
    with pytest.raises(g.GlueFormatError, match=r"dev\.tsv:3: needs column 2 .*has 2 tab-separated column.*--input-columns"):
        g.preprocess_glue(tmp_path, [g.GLUE_TASKS["RTE"]], tmp_path / "out", spm_model, lm_databin / "dict.txt")


def test_missing_folder_file_or_dictionary_are_clear_errors(tmp_path, spm_model, lm_databin, preprocess_glue_script):
    g = preprocess_glue_script
    dictionary = lm_databin / "dict.txt"
    with pytest.raises(g.GlueFormatError, match="GLUE data folder not found"):
        g.preprocess_glue(tmp_path / "nowhere", [g.GLUE_TASKS["RTE"]], tmp_path / "out", spm_model, dictionary)
    with pytest.raises(g.GlueFormatError, match=r"task folder not found: .*MRPC"):
        g.preprocess_glue(tmp_path, [g.GLUE_TASKS["MRPC"]], tmp_path / "out", spm_model, dictionary)
    _write_tsv(tmp_path / "SST-2" / "train.tsv", [["a sentence", "1"]], ["sentence", "label"])
    with pytest.raises(g.GlueFormatError, match=r"SST-2/dev\.tsv not found"):
        g.preprocess_glue(tmp_path, [g.GLUE_TASKS["SST-2"]], tmp_path / "out", spm_model, dictionary)
    with pytest.raises(FileNotFoundError, match="dictionary not found"):
        g.preprocess_glue(tmp_path, [g.GLUE_TASKS["SST-2"]], tmp_path / "out", spm_model, tmp_path / "dict.txt")


def test_a_split_without_examples_is_refused(tmp_path, spm_model, lm_databin, preprocess_glue_script):
    """fairseq-preprocess binarized an empty split without a word, and training failed on it much later."""
    g = preprocess_glue_script
    processor = load_model(spm_model)
    _write_tsv(tmp_path / "SST-2" / "train.tsv", [["a sentence", "1"]], ["sentence", "label"])
    _write_tsv(tmp_path / "SST-2" / "dev.tsv", [], ["sentence", "label"])
    with pytest.raises(g.GlueFormatError, match=r"SST-2/dev\.tsv has no examples: it is empty or holds only its header"):
        g.prepare_task(g.GLUE_TASKS["SST-2"], tmp_path, tmp_path / "out", processor, lm_databin / "dict.txt",
                       tmp_path / "work-sst", workers=1)
    qqp_header = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    _write_tsv(tmp_path / "QQP" / "train.tsv", [["0", "1", "2", "A broken line"]], qqp_header)
    _write_tsv(tmp_path / "QQP" / "dev.tsv", [["0", "1", "2", "Why?", "Why not?", "0"]], qqp_header)
    with pytest.raises(g.GlueFormatError, match=r"QQP/train\.tsv has no examples: .*no line with 6 tab-separated"):
        g.prepare_task(g.GLUE_TASKS["QQP"], tmp_path, tmp_path / "out", processor, lm_databin / "dict.txt",
                       tmp_path / "work-qqp", workers=1)


def test_qqp_filter_and_mnli_dev_test_pairs(tmp_path, spm_model, lm_databin, preprocess_glue_script):
    """prepare_task only, without binarizing: the fairseq-preprocess arguments and encoded files."""
    g = preprocess_glue_script
    processor = load_model(spm_model)
    qqp_header = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]
    _write_tsv(tmp_path / "QQP" / "train.tsv", [["0", "1", "2", "How are you?", "How do you do?", "1"],
                                                 ["1", "3", "4", "A broken line"]], qqp_header)
    _write_tsv(tmp_path / "QQP" / "dev.tsv", [["0", "1", "2", "Why?", "Why not?", "0"]], qqp_header)
    invocations = g.prepare_task(g.GLUE_TASKS["QQP"], tmp_path, tmp_path / "out", processor,
                                 lm_databin / "dict.txt", tmp_path / "work-qqp", workers=1)
    assert len((tmp_path / "work-qqp" / "train.input0").read_text().splitlines()) == 1  # fairseq's NF==6 filter
    assert [args[args.index("--destdir") + 1] for args in invocations] == [
        str(tmp_path / "out" / "QQP-bin" / name) for name in ("input0", "input1", "label")]

    mnli_row = ["0"] * 8 + ["The premise.", "The hypothesis."]
    _write_tsv(tmp_path / "MNLI" / "train.tsv", [mnli_row + ["x", "neutral"]], ["h"] * 12)
    for stem in ("dev_matched", "dev_mismatched"):
        _write_tsv(tmp_path / "MNLI" / f"{stem}.tsv", [mnli_row + ["x"] * 5 + ["contradiction"]], ["h"] * 16)
    for stem in ("test_matched", "test_mismatched"):
        _write_tsv(tmp_path / "MNLI" / f"{stem}.tsv", [mnli_row], ["h"] * 10)
    invocations = g.prepare_task(g.GLUE_TASKS["MNLI"], tmp_path, tmp_path / "out", processor,
                                 lm_databin / "dict.txt", tmp_path / "work-mnli", workers=1)
    work = tmp_path / "work-mnli"
    input0 = invocations[0]
    assert input0[input0.index("--validpref") + 1] == f"{work}/dev_matched.input0,{work}/dev_mismatched.input0"
    assert input0[input0.index("--testpref") + 1] == f"{work}/test_matched.input0,{work}/test_mismatched.input0"
    assert (work / "dev_mismatched.label").read_text() == "contradiction\n"
    assert "--testpref" not in invocations[-1] and "--srcdict" not in invocations[-1]  # the label invocation


def test_cli_argument_errors(preprocess_glue_script, tmp_path, capsys):
    main = preprocess_glue_script.main
    common = [str(tmp_path), "--spm-model", "m.model", "--dict", "dict.txt"]
    for argv, message in (
        (common, "either TASK or --custom-task"),
        (common + ["XNLI"], "unknown task 'XNLI'"),
        (common + ["--custom-task", "cls", "--input-columns", "0"], "needs --input-columns and --label-column"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_a_labelled_test_split_is_binarized_with_its_labels(tmp_path, spm_model, lm_databin, preprocess_glue_script):
    """--test-label-column: test.tsv's labels go into label/test, so fairseq-validate --valid-subset test scores it
    (GLUE's test files have none: without the option the test split stays inputs only)."""
    g = preprocess_glue_script
    rows = [["a first sentence", "x"], ["another one", "y"], ["and a third", "x"]]
    for stem in ("train", "dev", "test"):
        _write_tsv(tmp_path / "lab" / f"{stem}.tsv", rows, ["sentence", "label"])
    processor = load_model(spm_model)
    spec = g.custom_task_spec("lab", [0], 1, header=True, test_label_column=1)
    invocations = g.prepare_task(spec, tmp_path, tmp_path / "out", processor, lm_databin / "dict.txt",
                                 tmp_path / "work", workers=1)
    assert (tmp_path / "work" / "test.label").read_text().splitlines() == ["x", "y", "x"]
    label = next(args for args in invocations if args[args.index("--destdir") + 1].endswith("label"))
    assert label[label.index("--testpref") + 1] == str(tmp_path / "work" / "test.label")
    unlabelled = g.prepare_task(g.custom_task_spec("lab", [0], 1, header=True), tmp_path, tmp_path / "out2", processor,
                                lm_databin / "dict.txt", tmp_path / "work2", workers=1)
    assert not (tmp_path / "work2" / "test.label").exists()
    assert "--testpref" not in next(a for a in unlabelled if a[a.index("--destdir") + 1].endswith("label"))
    (tmp_path / "lab" / "test.tsv").unlink()
    with pytest.raises(g.GlueFormatError, match="--test-label-column given but .*test.tsv does not exist"):
        g.prepare_task(spec, tmp_path, tmp_path / "out3", processor, lm_databin / "dict.txt", tmp_path / "work3", 1)
