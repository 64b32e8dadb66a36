"""examples/translation, run as written with tiny settings (numbered catalogs instead of the system's)."""
import re

from .recipes import run_recipe


def test_translation_recipe(tmp_path):
    from tests.data.mo_files import numbered_catalogs

    locale = numbered_catalogs(tmp_path / "locale", catalogs=20, per_catalog=40)
    log = run_recipe("translation", tmp_path, SIZE="tiny", CATALOGS=f"--locale-dir {locale} --min-pairs 500",
                     VOCAB="200")
    assert len(re.findall(r"^\s*BLEU\|nrefs:1\|case:mixed\|eff:no\|tok:13a", log, flags=re.M)) == 2  # step 3
    assert len(re.findall(r"^\s*chrF2\|nrefs:1", log, flags=re.M)) == 2
    assert len(re.findall(r"^H-\d+\t", log, flags=re.M)) == 2  # step 4: interactive
    assert len(re.findall(r"^> .* -> ", log, flags=re.M)) == 2  # the hub's translations
