"""The English -> German corpus from message catalogs: read with gettext, cleaned, split by catalog, deduplicated."""
import gettext
import subprocess
import sys

import pytest

from fairseq_linattn.data.catalogs import TooFewCatalogsError, collect, extract, read_catalog, split_by_catalog

from .mo_files import numbered_catalogs, write_mo


def test_written_catalogs_read_back_with_pythons_gettext(tmp_path):
    write_mo(tmp_path / "x.mo", {"Hello %s": "Hallo %s", "two\nlines": "zwei\nZeilen"})
    with open(tmp_path / "x.mo", "rb") as f:
        assert gettext.GNUTranslations(f).gettext("Hello %s") == "Hallo %s"
    assert read_catalog(tmp_path / "x.mo") == [("Hello %s", "Hallo %s"), ("two\\nlines", "zwei\\nZeilen")]


def test_cleaning_drops_contexts_copies_and_the_header(tmp_path):
    write_mo(tmp_path / "x.mo", {"ctx\x04Open": "Öffnen", "same": "same", "  padded\t": "gepolstert "})
    assert sorted(read_catalog(tmp_path / "x.mo")) == [("Open", "Öffnen"), ("padded", "gepolstert")]


def test_splits_hold_whole_catalogs_and_no_pair_twice(tmp_path):
    catalogs = collect(locale_dirs=[numbered_catalogs(tmp_path)], min_pairs=100)
    splits = split_by_catalog(catalogs, seed=1)
    assert all(splits[s] for s in ("train", "valid", "test"))
    in_every = {("shared message", "gemeinsame Meldung"), ("Open", "Öffnen")}
    owner = {pair: name for name, pairs in catalogs.items() for pair in pairs if pair not in in_every}
    for split, pairs in splits.items():
        others = {owner[p] for s, ps in splits.items() if s != split for p in ps if p in owner}
        assert not {owner[p] for p in pairs if p in owner} & others, f"a catalog in {split} and another split"
    everything = [p for pairs in splits.values() for p in pairs]
    assert len(everything) == len(set(everything))
    assert sum(p == ("shared message", "gemeinsame Meldung") for p in everything) == 1
    assert all("%s" in en and "%s" in de for en, de in everything if en.startswith("cannot"))  # placeholders kept
    assert split_by_catalog(catalogs, seed=1) == splits  # seeded


@pytest.mark.slow
def test_too_few_catalogs_say_how_to_get_more(tmp_path):
    numbered_catalogs(tmp_path, catalogs=2, per_catalog=5)
    with pytest.raises(TooFewCatalogsError, match=r"found 14 English->de message pairs in 2 catalogs.*apt-get install"):
        extract(tmp_path / "out", locale_dirs=[tmp_path])
    run = subprocess.run([sys.executable, "-m", "fairseq_linattn.data.catalogs", "--out", str(tmp_path / "out"),
                          "--locale-dir", str(tmp_path / "nothing")], capture_output=True, text=True)
    assert run.returncode == 2 and "found 0 English->de message pairs" in run.stderr
