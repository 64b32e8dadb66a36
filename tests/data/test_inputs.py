"""The data scripts' input checks (fairseq_linattn.data.inputs): a missing, empty or blank input is an InputError
naming the file and the fix, before anything is written."""
import pytest

from fairseq_linattn.data.inputs import InputError, MissingInputError, check_existing, check_text_file


def test_text_files_need_a_line_that_is_not_blank(tmp_path):
    fix = "one paragraph per line"
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "blank.txt").write_text("\n  \n\t\r\n")
    (tmp_path / "text.txt").write_text("\n\nsome text\n")
    for name in ("empty.txt", "blank.txt"):
        with pytest.raises(InputError, match=rf"^{tmp_path}/{name} is empty \(or has no text lines\): {fix}$"):
            check_text_file(tmp_path / name, "the train text", fix)
    assert check_text_file(tmp_path / "text.txt", "the train text", fix) == tmp_path / "text.txt"
    with pytest.raises(MissingInputError, match=rf"^the train text {tmp_path}/missing.txt is not found: {fix}$"):
        check_text_file(tmp_path / "missing.txt", "the train text", fix)
    with pytest.raises(FileNotFoundError, match="is a folder, not a file"):  # (a MissingInputError is one)
        check_text_file(tmp_path, "the train text", fix)


def test_options_naming_files_must_name_existing_ones(tmp_path):
    check_existing(None, "--srcdict", "a dict.txt")  # not given
    with pytest.raises(MissingInputError, match=rf"^--srcdict {tmp_path}/dict.txt does not exist: pass a dict.txt$"):
        check_existing(tmp_path / "dict.txt", "--srcdict", "a dict.txt")
    with pytest.raises(MissingInputError, match="is a folder: pass a dict.txt"):
        check_existing(tmp_path, "--srcdict", "a dict.txt")
