#!/usr/bin/env python
"""fairseq's own tests, run twice with the same Python: plain, and with ``import fairseq_linattn`` first; prints the
tests whose outcome differs. The check that the plugin is a good guest: importing it must change nothing that
fairseq's tests check (docs/reliability.md lists what was run and what differs, with the reason).

    python scripts/fairseq_upstream_tests.py CHECKOUT [TEST_FILE ...] [--workers 2] [-k EXPR] [--report out.json]

CHECKOUT is a clone of facebookresearch/fairseq at the commit the installed fairseq was built from (``ecbf110e`` for
``fairseq-fixed==0.12.3.1``; its source distribution has no ``tests/utils.py``, so this is not part of CI). Its
``tests/`` folder is copied to a scratch folder and run there against the *installed* fairseq (the checkout's own
``fairseq/`` package is never imported: it has no compiled extensions); its ``examples/`` and ``scripts/`` folders,
when present, are linked beside it (the tests' ``--user-dir examples/...``, ``import scripts.average_checkpoints``).

Both runs get the two shims any torch >= 2.6 / numpy 2 user of fairseq 0.12 needs (``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``
and ``numpy.compat``, from a ``sitecustomize`` module); the second one's ``sitecustomize`` also imports the plugin, so
the subprocesses that some tests start have it too. ``FAIRSEQ_LINATTN_ALL_MODELS`` (the opt-in that extends the
plugin's behaviour changes to fairseq's own models) is removed from both environments unless ``--opt-in`` is given.
``--no-shims`` leaves the two shims out of both runs: the differences are then what the plugin's process-wide fixes
make fairseq do at all (load its checkpoints, use numpy 2).

With workers, each test file runs whole on one worker (``--dist loadfile``), so both runs see the same order. A test
whose outcome differs is run again alone, ``--repeat`` times plain and as many with the plugin: some of fairseq's tests
draw their data from the unseeded global ``random`` (``tests/utils.create_dummy_data``), so their outcome can change
from one run to the next (FLAKY: both outcomes seen on one side, and an outcome both sides share) or hang on the
tests before them (ORDER-DEPENDENT: alone, both sides agree every time). Only the rest count as differences.

Exit status: 0 when every test has the same outcome in both runs (or alone), 1 when some differ, 2 for a usage error.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Dict, List, Tuple

# what the "done when" names: the upstream tests that touch what the plugin wraps
DEFAULT_TESTS = (
    "test_sequence_generator.py", "test_sequence_scorer.py", "test_checkpoint_utils.py", "test_train.py",
    "test_iterators.py", "test_lm_context_window.py", "test_binaries.py",
)
OPT_IN_VARIABLE = "FAIRSEQ_LINATTN_ALL_MODELS"  # (fairseq_linattn.compat.scope.OPT_IN_VARIABLE; not imported here)

SHIMS = """\
# written by fairseq_upstream_tests.py: what fairseq 0.12 needs under numpy 2 (np.compat.long)
import types
import numpy
if not hasattr(numpy, "compat"):
    numpy.compat = types.SimpleNamespace(long=int)
"""
WITH_PLUGIN = "import fairseq_linattn  # noqa: F401,E402  (the second run: the plugin imported first)\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkout", help="a clone of facebookresearch/fairseq (the folder holding tests/utils.py)")
    parser.add_argument("tests", nargs="*", default=list(DEFAULT_TESTS),
                        help="test files under its tests/ folder (default: %(default)s)")
    parser.add_argument("-k", dest="keyword", help="pytest's -k: only the tests matching this expression")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per run (0: one process)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="how many times a test whose outcome differs is run again alone, on each side")
    parser.add_argument("--python", default=sys.executable, help="the Python that has fairseq (and the plugin)")
    parser.add_argument("--opt-in", action="store_true",
                        help=f"set {OPT_IN_VARIABLE}=1 in the plugin's run (the differences it makes are the opt-in's)")
    parser.add_argument("--no-shims", action="store_true",
                        help="no TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD and numpy.compat in either run (shows the plugin's fixes)")
    parser.add_argument("--keep", metavar="DIR", help="run in DIR and keep it (the logs and junit files), not a temp dir")
    parser.add_argument("--report", metavar="FILE", help="also write every test's two outcomes to FILE (JSON)")
    args = parser.parse_args(argv)
    tests_dir = os.path.join(args.checkout, "tests")
    if not os.path.isfile(os.path.join(tests_dir, "utils.py")):
        parser.error(f"{args.checkout} has no tests/utils.py: pass a clone of facebookresearch/fairseq (git clone "
                     "https://github.com/facebookresearch/fairseq; git checkout ecbf110e), not an installed fairseq")
    missing = [t for t in args.tests if not os.path.isfile(os.path.join(tests_dir, t.split("::")[0]))]
    if missing:
        parser.error(f"no such test file under {tests_dir}: {', '.join(missing)}")
    if args.workers < 0:
        parser.error(f"--workers must be 0 or more, got {args.workers}")
    if args.repeat < 1:
        parser.error(f"--repeat must be 1 or more, got {args.repeat}")
    if args.keep and os.path.exists(args.keep) and not (os.path.isdir(args.keep) and not os.listdir(args.keep)):
        parser.error(f"--keep {args.keep} exists and is not an empty folder: name a new folder")
    return args


def prepare(checkout: str, work: str, shims: bool = True):
    """The scratch folder: a copy of the checkout's tests/, its examples/ and scripts/ linked, and one sitecustomize
    per run."""
    shutil.copytree(os.path.join(checkout, "tests"), os.path.join(work, "tests"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder in ("examples", "scripts"):
        source = os.path.abspath(os.path.join(checkout, folder))
        if os.path.isdir(source):
            os.symlink(source, os.path.join(work, folder))
    for side, extra in (("plain", ""), ("plugin", WITH_PLUGIN)):
        os.makedirs(os.path.join(work, "site", side), exist_ok=True)
        with open(os.path.join(work, "site", side, "sitecustomize.py"), "w") as f:
            f.write((SHIMS if shims else "") + extra)


def run_side(args, work: str, side: str, tests=None, workers=None, name=None) -> Tuple[Dict[str, Tuple[str, str]], float]:
    """Run ``tests`` (default: the command line's) on one side; (test id -> outcome, seconds)."""
    workers = args.workers if workers is None else workers
    name = name or side
    env = {k: v for k, v in os.environ.items() if k not in (OPT_IN_VARIABLE, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    if not args.no_shims:
        env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(work, "site", side), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if side == "plugin" and args.opt_in:
        env[OPT_IN_VARIABLE] = "1"
    junit = os.path.join(work, f"{name}.xml")
    selected = tests or [os.path.join("tests", t) for t in args.tests]
    command = [args.python, "-m", "pytest", *selected, "-p", "no:cacheprovider", "-q", "-o", "addopts=",
               f"--junitxml={junit}"]
    if args.keyword and not tests:
        command += ["-k", args.keyword]
    if workers > 0:
        command += ["-n", str(workers), "--dist", "loadfile"]
    start = time.time()
    with open(os.path.join(work, f"{name}.log"), "w") as log:
        subprocess.run(command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    if not os.path.isfile(junit):
        sys.exit(f"the {name} run wrote no results: see {os.path.join(work, name + '.log')}")
    return outcomes(junit), time.time() - start


def node_id(test: str, work: str) -> str:
    """pytest's node id of a junit test id (``tests.test_x.Class::name`` -> ``tests/test_x.py::Class::name``)."""
    classname, name = test.split("::", 1)
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = os.path.join(*parts[:i]) + ".py"
        if os.path.isfile(os.path.join(work, path)):
            return "::".join([path, *parts[i:], name])
    return test



def outcomes(junit: str) -> Dict[str, Tuple[str, str]]:
    """test id -> (passed / failed / error / skipped, the first line of its message)."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or child.text or "").strip().splitlines()
                message = message[0][:200] if message else ""
                break
        found[test] = (outcome, message)
    return found


def counts(found: Dict[str, Tuple[str, str]]) -> str:
    tally: Dict[str, int] = {}
    for outcome, _ in found.values():
        tally[outcome] = tally.get(outcome, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(tally.items()))


def main(argv=None):
    args = parse_args(argv)
    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="fairseq_upstream_")
    if args.keep:
        os.makedirs(work, exist_ok=True)
    try:
        prepare(args.checkout, work, shims=not args.no_shims)
        runs = {}
        for side in ("plain", "plugin"):
            runs[side], seconds = run_side(args, work, side)
            print(f"{side:6s}: {len(runs[side])} tests, {counts(runs[side])} ({seconds:.0f} s)", flush=True)
        plain, plugin = runs["plain"], runs["plugin"]
        differ: List[str] = sorted(t for t in set(plain) | set(plugin)
                                   if plain.get(t, ("absent", ""))[0] != plugin.get(t, ("absent", ""))[0])
        alone, verdicts = {}, {}
        for i, test in enumerate(differ):  # again, alone: flaky, order-dependent or the plugin's?
            alone[test] = {side: sorted({run_side(args, work, side, tests=[node_id(test, work)], workers=0,
                                                  name=f"{side}-alone{i}-{r}")[0].get(test, ("absent", ""))[0]
                                         for r in range(args.repeat)}) for side in ("plain", "plugin")}
            seen = alone[test]
            if len(seen["plain"]) > 1 or len(seen["plugin"]) > 1:
                verdicts[test] = "FLAKY" if set(seen["plain"]) & set(seen["plugin"]) else "DIFFERS"
            else:
                verdicts[test] = "ORDER-DEPENDENT" if seen["plain"] == seen["plugin"] else "DIFFERS"
        real = [t for t in differ if verdicts[t] == "DIFFERS"]
        for test in differ:
            before, after = plain.get(test, ("absent", "")), plugin.get(test, ("absent", ""))
            message = after[1] or before[1]
            print(f"{verdicts[test]} {test}: plain {before[0]}, with the plugin {after[0]}; alone ({args.repeat} runs "
                  f"each): plain {'/'.join(alone[test]['plain'])}, with the plugin {'/'.join(alone[test]['plugin'])}"
                  + (f" ({message})" if message else ""))
        print(f"{len(real)} of {len(set(plain) | set(plugin))} tests differ"
              + (f", {len(differ) - len(real)} more whose outcome varies without the plugin too" if len(differ) > len(real)
                 else "") + (f" ({OPT_IN_VARIABLE}=1 in the plugin's run)" if args.opt_in else ""))
        if args.report:
            with open(args.report, "w") as f:
                json.dump({"tests": args.tests, "opt_in": args.opt_in,
                           "outcomes": {t: {"plain": plain.get(t), "plugin": plugin.get(t), "alone": alone.get(t),
                                            "verdict": verdicts.get(t, "same")}
                                        for t in sorted(set(plain) | set(plugin))}}, f, indent=1)
        return 1 if real else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
