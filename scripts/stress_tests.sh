#!/usr/bin/env bash
# Run tests again and again on a busy machine: the check that a flaky test is gone.
#   bash scripts/stress_tests.sh [ROUNDS] [PYTEST ARGS...]
# Defaults: 20 rounds of the distributed and kill/resume tests. Two busy loops (BUSY_LOOPS) keep both cores loaded
# for the whole run (the load under which a two-worker run once died); the first failing round stops it, its log kept.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
rounds="${1:-20}"
if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
  echo "stress_tests.sh: error: ROUNDS must be a whole number >= 1, got '$rounds' (usage: bash scripts/stress_tests.sh [ROUNDS] [PYTEST ARGS...])" >&2
  exit 2
fi
shift || true
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/e2e/test_distributed_cpu.py tests/e2e/test_two_workers.py tests/e2e/test_resume.py)
logs="$(mktemp -d)"
busy=()
# BUSY_LOOPS=0 when another job (a long benchmark, say) keeps the cores busy for the whole run instead
loops="${BUSY_LOOPS:-2}"
if ! [[ "$loops" =~ ^[0-9]+$ ]]; then
  echo "stress_tests.sh: error: BUSY_LOOPS must be a whole number >= 0, got '$loops'" >&2
  exit 2
fi
for _ in $(seq 1 "$loops"); do .venv/bin/python -c "while True: pass" & busy+=($!); done
trap '[ ${#busy[@]} -eq 0 ] || kill "${busy[@]}" 2>/dev/null || true' EXIT
for round in $(seq 1 "$rounds"); do
  start=$(date +%s)
  if .venv/bin/python -m pytest "${tests[@]}" -p no:cacheprovider -q -x > "$logs/round$round.log" 2>&1; then
    echo "round $round/$rounds: $(grep -E '[0-9]+ passed' "$logs/round$round.log" | tail -1) ($(( $(date +%s) - start )) s)"
  else
    echo "round $round/$rounds: FAILED; log: $logs/round$round.log"
    tail -40 "$logs/round$round.log"
    exit 1
  fi
done
echo "all $rounds rounds passed (logs: $logs)"
