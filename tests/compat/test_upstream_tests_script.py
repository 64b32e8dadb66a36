"""scripts/fairseq_upstream_tests.py on a stand-in checkout whose tests see whether the plugin was imported first: it
names the test whose outcome the plugin changes (run again alone: still different) and exits 1, and tells a test whose
outcome varies from run to run on both sides from it; a checkout without tests/utils.py is one line. The real run, on
fairseq's own tests: docs/reliability.md."""
import json
import subprocess
import sys

import pytest

from tests.pages import ROOT

SCRIPT = ROOT / "scripts" / "fairseq_upstream_tests.py"
TESTS = '''
import os
import sys


def test_same_either_way():
    import fairseq

    assert "site-packages" in fairseq.__file__  # the installed fairseq, not a checkout's sources


def test_altered_by_the_plugin():
    assert "fairseq_linattn" not in sys.modules


def test_flaky_either_way():
    """Passes in every other process that runs it (a count kept in the scratch folder), as fairseq's own
    test_max_positions passes or fails with its data's lengths, drawn from the unseeded global random."""
    runs = int(open("runs").read()) + 1 if os.path.exists("runs") else 1
    open("runs", "w").write(str(runs))
    assert runs % 2 == 1
'''


@pytest.mark.slow
def test_it_names_the_test_the_plugin_changes(tmp_path):
    (tmp_path / "checkout" / "tests").mkdir(parents=True)
    (tmp_path / "checkout" / "tests" / "__init__.py").write_text("")
    (tmp_path / "checkout" / "tests" / "utils.py").write_text("")
    (tmp_path / "checkout" / "tests" / "test_guest.py").write_text(TESTS)
    done = subprocess.run([sys.executable, SCRIPT, tmp_path / "checkout", "test_guest.py", "--workers", "0", "--repeat",
                           "2", "--keep", tmp_path / "work"], capture_output=True, text=True, timeout=600)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines[0].startswith("plain : 3 tests, 3 passed") and lines[1].startswith("plugin: 3 tests, 2 failed, 1 passed")
    assert lines[2].startswith("DIFFERS tests.test_guest::test_altered_by_the_plugin: plain passed, with the plugin "
                               "failed; alone (2 runs each): plain passed, with the plugin failed"), lines
    assert lines[3].startswith("FLAKY tests.test_guest::test_flaky_either_way: plain passed, with the plugin failed; "
                               "alone (2 runs each): plain failed/passed, with the plugin failed/passed"), lines
    assert lines[-1] == "1 of 3 tests differ, 1 more whose outcome varies without the plugin too"
    done = subprocess.run([sys.executable, SCRIPT, tmp_path / "checkout", "test_guest.py", "-k", "not altered",
                           "--workers", "0", "--repeat", "2", "--report", tmp_path / "report.json"], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr  # a flaky test alone is no difference
    outcomes = json.loads((tmp_path / "report.json").read_text())["outcomes"]
    assert outcomes["tests.test_guest::test_flaky_either_way"]["verdict"] == "FLAKY"
    assert outcomes["tests.test_guest::test_same_either_way"]["verdict"] == "same"


def test_a_folder_without_fairseqs_tests_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, tmp_path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"fairseq_upstream_tests.py: error: {tmp_path} has no "
                                                           "tests/utils.py: pass a clone of facebookresearch/fairseq")
