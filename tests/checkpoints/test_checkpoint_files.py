"""Checkpoint files: safe loading tells a file that asks to run code from a damaged one, a copy is whole or
absent, and the fallback for a damaged checkpoint_last picks the right file and skips unreadable ones."""
import os
import zipfile

import pytest
import torch

from fairseq_linattn.checkpoints import (
    CorruptCheckpointError,
    NotACheckpointError,
    UnsafeCheckpointError,
    atomic_copy,
    newest_intact_checkpoint,
    safe_torch_load,
    unreadable_reason,
)


def fake_checkpoint(path, updates, **extra):
    torch.save({"model": {"w": torch.ones(3)}, "optimizer_history": [{"num_updates": updates}], **extra}, path)
    return path


class RunsCode:
    def __reduce__(self):
        return os.getcwd, ()


def test_unsafe_and_corrupt_are_told_apart(tmp_path):
    torch.save({"x": RunsCode()}, tmp_path / "code.pt")
    with pytest.raises(UnsafeCheckpointError, match="it pickles posix.getcwd"):
        safe_torch_load(str(tmp_path / "code.pt"))
    (tmp_path / "garbage.pt").write_bytes(b"\x80\x02garbage that is no pickle")
    torch.save({"a": 1}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    legacy = (tmp_path / "legacy.pt").read_bytes()
    (tmp_path / "legacy_cut.pt").write_bytes(legacy[: len(legacy) // 2])
    good = fake_checkpoint(tmp_path / "good.pt", 1)
    damaged = tmp_path / "damaged_pickle.pt"
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(damaged, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, data[: len(data) // 2] if info.filename.endswith("data.pkl") else data)
    for name in ("garbage.pt", "legacy_cut.pt", "damaged_pickle.pt"):  # not files asking to run code
        with pytest.raises(CorruptCheckpointError):
            safe_torch_load(str(tmp_path / name))
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CorruptCheckpointError, match="it is empty \\(0 bytes\\)"):
        safe_torch_load(str(tmp_path / "empty.pt"))


def test_a_file_that_is_no_checkpoint_is_told_from_a_damaged_one(tmp_path):
    """A wrong path (random bytes, text, another format) is "not a PyTorch checkpoint", with what it looks like;
    it is not reported as a checkpoint cut off while being written (which no kill explains)."""
    import pickle

    import numpy

    files = {
        "random.pt": (bytes(range(7, 207)) * 2, "400 bytes starting b'\\x07\\x08\\t\\n"),
        "notes.pt": (b"hello, this is a README\n", "24 bytes of text starting 'hello, this is a README\\n'"),
        "plain.pkl": (pickle.dumps({"w": [1, 2, 3]}, protocol=2), "a Python pickle but not one that torch.save wrote"),
        "weights.safetensors": ((10).to_bytes(8, "little") + b'{"a": 1}  ' + bytes(8), "a safetensors file"),
    }
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    numpy.save(tmp_path / "array.npy", numpy.ones(3))
    files["array.npy"] = (None, "a numpy .npy array")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("a.txt", "x")
    files["other.zip"] = (None, "a zip archive of ")
    for name, (_, looks) in files.items():
        with pytest.raises(NotACheckpointError, match=r"it is not a PyTorch checkpoint \(") as raised:
            safe_torch_load(str(tmp_path / name))
        assert looks in str(raised.value) and "cut off" not in str(raised.value), str(raised.value)
        assert isinstance(raised.value, CorruptCheckpointError)  # (for callers that catch that)
    assert "without the data.pkl torch.save writes: a.txt" in unreadable_reason(str(tmp_path / "other.zip"))
    # damaged checkpoints stay damaged: truncated, empty, a legacy (pickle) file cut within its header
    good = fake_checkpoint(tmp_path / "good.pt", 1)
    (tmp_path / "cut.pt").write_bytes(good.read_bytes()[:-100])
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save({"a": 1}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    (tmp_path / "legacy_cut.pt").write_bytes((tmp_path / "legacy.pt").read_bytes()[:10])
    for name, reason in (("cut.pt", "it is truncated"), ("empty.pt", "it is empty (0 bytes)"), ("legacy_cut.pt", "")):
        with pytest.raises(CorruptCheckpointError, match="cut off while being written") as raised:
            safe_torch_load(str(tmp_path / name))
        assert reason in str(raised.value) and not isinstance(raised.value, NotACheckpointError)


def test_atomic_copy_leaves_whole_files(tmp_path):
    src = fake_checkpoint(tmp_path / "a.pt", 3)
    atomic_copy(str(src), str(tmp_path / "b.pt"))
    assert (tmp_path / "b.pt").read_bytes() == src.read_bytes() and not list(tmp_path.glob("*.partial"))
    assert unreadable_reason(str(tmp_path / "b.pt")) is None
    cut = tmp_path / "cut.pt"
    cut.write_bytes(src.read_bytes()[:-100])
    assert unreadable_reason(str(cut)).startswith("it is truncated")


def test_fairseq_copies_checkpoints_with_the_atomic_copy(tmp_path, monkeypatch):
    """fairseq's save_checkpoint copies through ``checkpoint_utils.PathManager``: the plugin's stands there."""
    from fairseq import checkpoint_utils

    import fairseq_linattn  # noqa: F401  (installs the fixes)

    copies = []
    monkeypatch.setattr("fairseq_linattn.compat.checkpoints.atomic_copy", lambda src, dst: copies.append((src, dst)))
    src = fake_checkpoint(tmp_path / "checkpoint_1_5.pt", 5)
    checkpoint_utils.PathManager.copy(str(src), str(tmp_path / "checkpoint_last.pt"), overwrite=True)
    assert copies == [(str(src), str(tmp_path / "checkpoint_last.pt"))]


def test_fallback_prefers_progress_skips_the_unreadable_and_the_excluded(tmp_path):
    fake_checkpoint(tmp_path / "checkpoint_1_5.pt", 5)
    fake_checkpoint(tmp_path / "checkpoint_best.pt", 10)  # a copy of checkpoint_1_10, written after it
    fake_checkpoint(tmp_path / "checkpoint_1_10.pt", 10)
    os.utime(tmp_path / "checkpoint_best.pt")
    assert newest_intact_checkpoint(str(tmp_path)).endswith("checkpoint_1_10.pt")
    # a whole zip whose pickle is damaged: skipped (with a warning), not an error that ends the fallback
    (tmp_path / "checkpoint_1_15.pt").write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    with zipfile.ZipFile(tmp_path / "checkpoint_1_20.pt", "w") as broken:
        broken.writestr("archive/data.pkl", b"\x80\x02not a pickle")
    assert newest_intact_checkpoint(str(tmp_path)).endswith("checkpoint_1_10.pt")
    pretrained = fake_checkpoint(tmp_path / "checkpoint_pretrained.pt", 100_000)  # someone's model kept there
    assert newest_intact_checkpoint(str(tmp_path)).endswith("checkpoint_pretrained.pt")
    assert newest_intact_checkpoint(str(tmp_path), progress_named_only=True).endswith("checkpoint_1_10.pt")
    assert newest_intact_checkpoint(str(tmp_path), exclude=[str(pretrained)]).endswith("checkpoint_1_10.pt")
