"""The second classification task: Debian package descriptions -> their Section, from apt's package lists."""
import gzip
import lzma

import pytest

from fairseq_linattn.data import debian_packages as deb
from fairseq_linattn.data.inputs import InputError

SECTIONS = ("games", "sound")


def stanza(package, section, description, source=None):
    lines = [f"Package: {package}", *([f"Source: {source} (1.0)"] if source else []), "Version: 1.0",
             f"Description: {description}", "Tag: role::program,", " use::gameplaying", f"Section: {section}"]
    return "\n".join(lines)


def packages_text(count=400):
    stanzas = []
    for i in range(count):
        stanzas.append(stanza(f"game{i}", "games", f"puzzle game number {i} for the whole family"))
        stanzas.append(stanza(f"game{i}-data", "games", f"puzzle game number {i} (data files)", source=f"game{i}"))
        stanzas.append(stanza(f"synth{i}", "sound", f"software synthesizer {i} with MIDI input"))
        stanzas.append(stanza(f"lib{i}", "libs", f"library {i} shared objects"))
    stanzas.append(stanza("game0", "sound", "a second stanza for a package seen already"))
    return "\n\n".join(stanzas) + "\n"


def test_splits_by_source_package_without_duplicates_or_leaks(tmp_path):
    (tmp_path / "Packages").write_text(packages_text())
    summary = deb.extract(tmp_path / "out", [tmp_path / "Packages"], SECTIONS, per_class=300)
    rows = {split: [line.split("\t") for line in (tmp_path / "out" / "cls" / f"{split}.tsv").read_text().splitlines()[1:]]
            for split in ("train", "dev", "test")}
    assert summary["classification"]["train"] == {"games": 300, "sound": 300}  # capped per class
    descriptions = [d for split in rows.values() for d, _ in split]
    assert len(descriptions) == len(set(descriptions)) and "a second stanza" not in " ".join(descriptions)
    assert all(label in SECTIONS for split in rows.values() for _, label in split)
    # a source package's binaries stay in one split: "game7" and "game7-data" never part
    where = {d.split(" (")[0] if "data files" in d else d.rsplit(" for", 1)[0]: split
             for split, examples in rows.items() for d, _ in examples if d.startswith("puzzle")}
    for split, examples in rows.items():
        for d, _ in examples:
            if "data files" in d:
                assert where.get(d.split(" (")[0], split) == split, d
    corpus = {split: (tmp_path / "out" / "corpus" / f"{split}.txt").read_text().splitlines()
              for split in ("train", "valid", "test")}
    assert any(line.startswith("library") for line in corpus["train"])  # every section's text, for pretraining
    held_out = {d for split in ("dev", "test") for d, _ in rows[split]}
    assert not held_out & set(corpus["train"])  # no dev or test example in the pretraining text
    assert "Tag" not in (tmp_path / "out" / "cls" / "train.tsv").read_text()


@pytest.mark.parametrize("suffix,compress", [(".gz", gzip.compress), (".xz", lzma.compress)])
def test_compressed_lists(tmp_path, suffix, compress):
    (tmp_path / f"x_Packages{suffix}").write_bytes(compress(packages_text(10).encode()))
    assert deb.read_text(tmp_path / f"x_Packages{suffix}") == packages_text(10)
    assert deb.find_package_lists(tmp_path) == [tmp_path / f"x_Packages{suffix}"]


def test_mistakes_are_one_line(tmp_path, monkeypatch, capsys):
    with pytest.raises(InputError, match="no \\*_Packages file in .*: run `apt-get update`"):
        deb.find_package_lists(tmp_path)
    (tmp_path / "x_Packages.lz4").write_bytes(b"")
    monkeypatch.setattr(deb.shutil, "which", lambda name: None)
    with pytest.raises(InputError, match="lz4-compressed and the lz4 command is missing: apt-get install lz4"):
        deb.read_text(tmp_path / "x_Packages.lz4")
    (tmp_path / "Packages").write_text(packages_text(10))
    with pytest.raises(InputError, match="--sections fonts: no package of the lists is in that section"):
        deb.extract(tmp_path / "out", [tmp_path / "Packages"], ("fonts",))
    with pytest.raises(InputError, match="only 30 packages of sections games,sound .at least 600"):
        deb.extract(tmp_path / "out", [tmp_path / "Packages"], SECTIONS)
    with pytest.raises(SystemExit) as stop:
        deb.main(["--out", str(tmp_path / "out"), "--packages", str(tmp_path / "nothing")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"--packages {tmp_path / 'nothing'} does not "
                                                                     "exist: pass a Packages file")
