#!/usr/bin/env bash
# The README's test command (and CI's): install what is missing into .venv, then run the whole suite on two
# workers (pytest-xdist), printing the 25 slowest tests. Extra arguments go to pytest, e.g. -m "not slow" for
# the fast tier (ops, layers, models, data, options: no fairseq command) or -n 0 for one process.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
.venv/bin/ruff check --config scripts/ruff.toml fairseq_linattn scripts tests examples
exec .venv/bin/python -m pytest tests -p no:cacheprovider -q -rs -n 2 --dist loadscope --durations=25 "$@"
