"""The data scripts through their real command lines: a user's mistake (empty or missing input, a folder that does
not exist, a vocabulary the text cannot fill, too few message catalogs, a GLUE file with no examples) is argparse's
one line and exit status 2, found before anything is written, and the output folder is as it was (absent if it
did not exist; its old files otherwise)."""
import pytest

from ..data.mo_files import numbered_catalogs
from .cli import ROOT, python

LM, TRANSLATION, GLUE = (f"{ROOT}/scripts/{name}.py" for name in ("prepare_lm_data", "prepare_translation_data",
                                                                  "preprocess_glue"))
TEXT = "".join(f"line {i} of a small text with words like alpha beta gamma\n" for i in range(50))


def assert_one_line_error(log, script, message):
    """The command ended with ``<script>: error: ...message...``, exit 2, and no traceback."""
    last = log.strip().splitlines()[-1]
    assert log.returncode == 2 and last.startswith(f"{script}: error: ") and message in last, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


LM_CASES = {  # files in raw/ (None: absent), extra arguments, the message
    "empty train and valid": ({"train.txt": "", "valid.txt": ""}, [], "raw/train.txt is empty (or has no text lines)"),
    "blank lines only": ({"train.txt": TEXT, "valid.txt": "\n  \n"}, [], "raw/valid.txt is empty (or has no text lines)"),
    "no valid.txt": ({"train.txt": TEXT}, [], "the valid text RAW/valid.txt is not found"),
    "no raw dir": (None, [], "--raw-dir RAW does not exist"),
    "not UTF-8": ({"train.txt": TEXT, "valid.txt": b"caf\xe9\n"}, ["--vocab-size", "100", "--soft-vocab-limit"],
                  "raw/valid.txt is not UTF-8 text (b'\\xe9' cannot be decoded)"),
    "vocabulary too large": ({"train.txt": TEXT, "valid.txt": TEXT}, ["--vocab-size", "5000"],
                             "vocab_size=5000 is too large for the training text"),
    "vocabulary too small": ({"train.txt": TEXT, "valid.txt": TEXT}, ["--vocab-size", "10"],
                             "vocab_size=10 is too small for the training text"),
    "a file that is no sentencepiece model": ({"train.txt": TEXT, "valid.txt": TEXT}, ["--spm-model", "RAW/train.txt"],
                                              "raw/train.txt is not a sentencepiece model"),
}


@pytest.mark.parametrize("destination", ["new", "existing"])
@pytest.mark.parametrize("case", LM_CASES)
def test_prepare_lm_data_mistakes_are_one_line_and_leave_no_output(case, destination, tmp_path):
    files, extra, message = LM_CASES[case]
    raw = tmp_path / "raw"
    for name, text in (files or {}).items():
        write(raw / name, text)
    destdir = tmp_path / "out" / "data-bin"  # "new": neither it nor its parent exists
    if destination == "existing":
        write(destdir / "dict.txt", "old dictionary\n")
    args = [str(a).replace("RAW", str(raw)) for a in extra]
    # the first case starts the script for real (the rest are forked, without the imports)
    log = python(LM, "--raw-dir", raw, "--destdir", destdir, *args, check=False, subprocess=case == "empty train and valid")
    assert_one_line_error(log, "prepare_lm_data.py", message.replace("RAW", str(raw)))
    if destination == "new":
        assert not (tmp_path / "out").exists()
    else:
        assert [p.name for p in destdir.iterdir()] == ["dict.txt"] and (destdir / "dict.txt").read_text() == "old dictionary\n"
    assert not list(tmp_path.glob("**/*.partial"))


def test_prepare_translation_data_tells_a_missing_locale_dir_from_one_without_catalogs(tmp_path):
    destdir = tmp_path / "data-bin"
    log = python(TRANSLATION, "--destdir", destdir, "--locale-dir", tmp_path / "locale-typo", check=False,
                 subprocess=True)
    assert_one_line_error(log, "prepare_translation_data.py", f"--locale-dir {tmp_path}/locale-typo does not exist")
    (tmp_path / "empty").mkdir()
    log = python(TRANSLATION, "--destdir", destdir, "--locale-dir", tmp_path / "empty", check=False)
    assert_one_line_error(log, "prepare_translation_data.py", "found no English->de message catalogs (looked for "
                          f"{tmp_path}/empty/de/LC_MESSAGES/*.mo)")
    locale = numbered_catalogs(tmp_path / "locale", catalogs=3, per_catalog=20)
    log = python(TRANSLATION, "--destdir", destdir, "--locale-dir", locale / "de", check=False)
    assert_one_line_error(log, "prepare_translation_data.py", f"{locale}/de holds the catalogs themselves: --locale-dir "
                          f"takes the folder above the language folders ({locale})")
    log = python(TRANSLATION, "--destdir", destdir, "--locale-dir", locale, check=False)
    assert_one_line_error(log, "prepare_translation_data.py", "found 66 English->de message pairs in 3 catalogs")
    numbered_catalogs(tmp_path / "two", catalogs=2, per_catalog=20)
    log = python(TRANSLATION, "--destdir", destdir, "--locale-dir", tmp_path / "two", "--min-pairs", "10", check=False)
    assert_one_line_error(log, "prepare_translation_data.py", "found 2 catalog(s): the splits take whole catalogs")
    assert not destdir.exists()


@pytest.fixture
def glue_inputs(spm_data, tmp_path):
    """A custom task in GLUE layout whose dev.tsv holds its header only, the pretraining data-bin's sentencepiece
    model and dictionary, and an OUT folder with the task's binarized files of an earlier run."""
    data, spm_model = spm_data
    write(tmp_path / "glue" / "cls" / "train.tsv", "text\tlabel\nalpha beta\t0\ngamma\t1\n")
    write(tmp_path / "glue" / "cls" / "dev.tsv", "text\tlabel\n")
    write(tmp_path / "out" / "cls-bin" / "input0" / "dict.txt", "from an earlier run\n")
    return ["--spm-model", spm_model, "--dict", data / "dict.txt", "--custom-task", "cls", "--input-columns", "0",
            "--label-column", "1", "--header", "--out", tmp_path / "out"]


def test_preprocess_glue_refuses_a_split_without_examples_and_keeps_the_old_output(glue_inputs, tmp_path):
    log = python(GLUE, tmp_path / "glue", *glue_inputs, check=False, subprocess=True)
    assert_one_line_error(log, "preprocess_glue.py", f"{tmp_path}/glue/cls/dev.tsv has no examples: it is empty or holds "
                          "only its header row")
    assert [str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*")] == [
        "cls-bin", "cls-bin/input0", "cls-bin/input0/dict.txt"]  # the earlier run's, untouched
    log = python(GLUE, tmp_path / "no-glue", *glue_inputs, check=False)
    assert_one_line_error(log, "preprocess_glue.py", f"GLUE data folder not found: {tmp_path}/no-glue")
