"""A data script's output folder is written whole or not at all (fairseq_linattn.data.output_folder.staged)."""
import pytest

from fairseq_linattn.data.inputs import InputError
from fairseq_linattn.data.output_folder import staged


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_new_folder_appears_whole_or_not_at_all(tmp_path):
    destination = tmp_path / "a" / "b" / "data-bin"  # its parents do not exist either
    with pytest.raises(RuntimeError, match="fairseq-preprocess failed"):
        with staged(destination) as staging:
            (staging / "dict.txt").write_text("half")
            raise RuntimeError("fairseq-preprocess failed")
    assert tree(tmp_path) == []  # the parents it made are gone too
    with staged(destination) as staging:
        assert not destination.exists()  # nothing there until the block succeeds
        (staging / "dict.txt").write_text("whole")
    assert tree(tmp_path) == ["a", "a/b", "a/b/data-bin", "a/b/data-bin/dict.txt"]


def test_an_existing_folder_keeps_its_files_on_failure_and_gets_whole_new_ones(tmp_path):
    (tmp_path / "RTE-bin" / "input0").mkdir(parents=True)
    (tmp_path / "RTE-bin" / "input0" / "stale.bin").write_text("old")
    (tmp_path / "dict.txt").write_text("old")
    (tmp_path / "notes.txt").write_text("the user's")
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit):
        with staged(tmp_path) as staging:
            (staging / "dict.txt").write_text("new")
            raise SystemExit(2)  # argparse's error, raised in the middle
    assert {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()} == before
    with staged(tmp_path) as staging:
        (staging / "dict.txt").write_text("new")
        (staging / "RTE-bin" / "input0").mkdir(parents=True)
        (staging / "RTE-bin" / "input0" / "train.bin").write_text("new")
    assert tree(tmp_path) == ["RTE-bin", "RTE-bin/input0", "RTE-bin/input0/train.bin", "dict.txt", "notes.txt"]
    assert (tmp_path / "dict.txt").read_text() == "new" and (tmp_path / "notes.txt").read_text() == "the user's"


def test_what_a_killed_run_left_is_cleared_and_a_file_is_no_folder(tmp_path):
    (tmp_path / ".data-bin.partial").mkdir()
    (tmp_path / ".data-bin.partial" / "train.bin").write_text("from a killed run")
    with staged(tmp_path / "data-bin") as staging:
        assert list(staging.iterdir()) == []
    assert tree(tmp_path) == ["data-bin"]
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match="the output folder .*/file is a file"):
        with staged(tmp_path / "file"):
            pass
