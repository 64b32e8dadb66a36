#!/usr/bin/env bash
# The README's test command (and CI's): install what is missing into .venv, then run the whole suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
.venv/bin/ruff check --config scripts/ruff.toml fairseq_linattn scripts tests examples
exec .venv/bin/python -m pytest tests -p no:cacheprovider -q -rs "$@"
