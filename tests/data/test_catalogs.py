"""The English -> German corpus from message catalogs: read with gettext, cleaned, split by catalog, deduplicated."""
import gettext
import subprocess
import sys

import pytest

from fairseq_linattn.data.catalogs import (
    TooFewCatalogsError,
    check_locale_dirs,
    collect,
    extract,
    read_catalog,
    split_by_catalog,
)
from fairseq_linattn.data.inputs import MissingInputError

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


def test_too_few_catalogs_say_where_they_were_looked_for_and_how_to_get_more(tmp_path):
    numbered_catalogs(tmp_path, catalogs=2, per_catalog=5)
    with pytest.raises(TooFewCatalogsError, match=rf"found 14 English->de message pairs in 2 catalogs \(looked for "
                                                  rf"{tmp_path}/de/LC_MESSAGES/\*.mo\); .*apt-get install"):
        extract(tmp_path / "out", locale_dirs=[tmp_path])
    with pytest.raises(TooFewCatalogsError, match=rf"found no English->de message catalogs \(looked for {tmp_path}/"
                                                  rf"empty/de/LC_MESSAGES/\*.mo, {tmp_path}/gone/de/LC_MESSAGES/\*.mo "
                                                  rf"\(no such folder\)\)"):
        (tmp_path / "empty").mkdir()
        collect(locale_dirs=[tmp_path / "empty", tmp_path / "gone"])
    for too_deep in (tmp_path / "de", tmp_path / "de" / "LC_MESSAGES"):  # the language's folder, or its LC_MESSAGES
        with pytest.raises(TooFewCatalogsError, match=rf"{too_deep} holds the catalogs themselves: --locale-dir takes "
                                                      rf"the folder above the language folders \({tmp_path}\)"):
            collect(locale_dirs=[too_deep])
    assert not (tmp_path / "out").exists()


def test_a_locale_dir_given_by_the_user_must_exist(tmp_path):
    check_locale_dirs([tmp_path])
    with pytest.raises(MissingInputError, match=rf"^--locale-dir {tmp_path}/typo does not exist: name a folder that "
                                                rf"holds de/LC_MESSAGES/\*.mo"):
        check_locale_dirs([tmp_path, tmp_path / "typo"])


def test_fewer_catalogs_than_splits_are_refused(tmp_path):
    """Splits take whole catalogs: with two, train was empty (sentencepiece: "INTERNAL: ... [!sentences_.empty()]")."""
    catalogs = collect(locale_dirs=[numbered_catalogs(tmp_path, catalogs=2, per_catalog=50)], min_pairs=10)
    with pytest.raises(TooFewCatalogsError, match=r"found 2 catalog\(s\): .* need at least 3"):
        split_by_catalog(catalogs)
    same = {"a": [("x", "y")], "b": [("x", "y")], "c": [("x", "y"), ("u", "v")]}  # valid's pairs are all in test
    with pytest.raises(TooFewCatalogsError, match=r"the (valid|train) split's catalogs \(\w\) hold no pair"):
        split_by_catalog(same)


@pytest.mark.slow
def test_the_catalogs_command_line_names_the_locale_dir_that_does_not_exist(tmp_path):
    run = subprocess.run([sys.executable, "-m", "fairseq_linattn.data.catalogs", "--out", str(tmp_path / "out"),
                          "--locale-dir", str(tmp_path / "nothing")], capture_output=True, text=True)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and last == (f"catalogs.py: error: --locale-dir {tmp_path}/nothing does not exist: name "
                                            "a folder that holds de/LC_MESSAGES/*.mo, such as /usr/share/locale")
    assert not (tmp_path / "out").exists()
