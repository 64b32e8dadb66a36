#!/usr/bin/env bash
# The README's main-job command: install what is missing into .venv, then run the whole story on the
# embedded corpus (pass --quick for the 2-minute version).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
cd "$root"
exec .venv/bin/python scripts/main_job.py "$@"
