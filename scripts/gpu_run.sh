#!/usr/bin/env bash
# On a GPU machine without network (Python 3.12 with torch, triton, numpy, sentencepiece, sacrebleu, pytest and
# matplotlib): install the wheels scripts/gpu_gather.sh carried in .gpu/wheels, compile fla-core's kernels on every core
# (scripts/gpu_warm_kernels.py: Triton otherwise compiles them one at a time inside the tests and benchmarks, which
# filled two leases), then, in one go, the CUDA tests (each kernel at its first working configuration) and the
# fp16/bf16 training check (side by side: neither is timed), then the GPU benchmarks alone on the GPU.
# Everything lands in $OUT (or the folder given as the first argument): logs, the tests' measured differences,
# results/gpu_*.md/.json/.png, packed into gpu.tar.gz after each stage, so that a run cut short returns what it did.
#
#   bash scripts/gpu_run.sh [OUT] [STAGES]      STAGES: any of warm,tests,train,bench (default all four)
#
# Each stage has a time limit (seconds: WARM_S, TESTS_S, TRAIN_S, BENCH_S) so that the whole run ends inside one device call;
# TEST_DTYPES (default "bf16 fp16 fp32"), TEST_FILTER (a pytest -k expression), PYTEST_ARGS, TRAIN_ARGS and BENCH_ARGS pass options on (e.g.
# PYTEST_ARGS='-k gla', TRAIN_ARGS='--only gated-delta', BENCH_ARGS='--tables ops'); AUTOTUNE (default first: each
# fla-core kernel at its first configuration that runs; quick or full: a search, which a 15-minute lease cannot
# compile) is the benchmarks' --autotune, and the warm-up compiles for it.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "${1:-${OUT:-$root/gpu_out}}" && cd "${1:-${OUT:-$root/gpu_out}}" && pwd)"
stages="${2:-warm,tests,train,bench}"
cd "$root"
site=/tmp/fairseq_linattn_site
export PYTHONUNBUFFERED=1 PYTHONPATH="$site:$root" PATH="$site/bin:$PATH"
export FAIRSEQ_LINATTN_FORK_COMMANDS=0  # plain subprocesses on the GPU machine

pack() {  # results and logs so far, in one file (the device call returns at most 8 files)
  tar -czf "$out/gpu.tar.gz" -C "$out" --exclude gpu.tar.gz . 2>/dev/null
}

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv || true
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu/wheels/*.whl \
    || { echo "error: installing the carried wheels failed: they are for the GPU machine's CPython 3.12 (x86-64); gather them with scripts/gpu_gather.sh first"; exit 1; }
  python3 -c "import torch, triton, fairseq, fla, fairseq_linattn; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__, torch.cuda.get_device_name())" \
    || { echo "error: the imports failed"; exit 1; }
} 2>&1 | tee "$out/setup.log"
[ "${PIPESTATUS[0]}" = 0 ] || { pack; exit 1; }

test_dtypes="${TEST_DTYPES:-bf16 fp16 fp32}"
if [[ $stages == *warm* ]]; then
  # the tests' dtypes and the benchmarks' bf16 kernels, as the benchmarks will run them (AUTOTUNE), shared out among the cores
  (cd scripts && timeout "${WARM_S:-180}" python3 gpu_warm_kernels.py --dtypes "${test_dtypes// /,}" \
    --autotune "${AUTOTUNE:-first}" --timeout $(( ${WARM_S:-180} - 10 ))) >"$out/warm.log" 2>&1 \
    || echo "the warm-up: exit $? (see warm.log)"
  grep -E "^warm-up:|FAILED" "$out/warm.log" | tail -n 12
  pack
fi

pids=()
if [[ $stages == *tests* ]]; then
  # one pytest per dtype, the training dtype first (a run cut short has done the most useful part); each kernel at its
  # first configuration that runs (FAIRSEQ_LINATTN_AUTOTUNE=first, tests/gpu/conftest.py); fp32 through fla-core is
  # checked in IEEE fp32 (its default is tf32), as the warm-up compiled it
  (
    deadline=$(( $(date +%s) + ${TESTS_S:-240} ))
    for dtype in $test_dtypes; do
      left=$(( deadline - $(date +%s) ))
      [ "$left" -gt 5 ] || { echo "no time left for the $dtype tests"; break; }
      f32=(); [ "$dtype" = fp32 ] && f32=(TRITON_F32_DEFAULT=ieee)
      env "${f32[@]}" FAIRSEQ_LINATTN_GPU_REPORT="$out/cuda_tests_$dtype.json" FAIRSEQ_LINATTN_AUTOTUNE=first \
        timeout "$left" \
        python3 -m pytest tests/gpu -p no:cacheprovider -q -rfEs --durations=10 -k "$dtype${TEST_FILTER:+ and ($TEST_FILTER)}" ${PYTEST_ARGS:-} \
        >"$out/cuda_tests_$dtype.log" 2>&1 || echo "the $dtype tests: exit $?"
    done
  ) >"$out/cuda_tests.log" 2>&1 &
  pids+=($!)
fi
if [[ $stages == *train* ]]; then
  timeout "${TRAIN_S:-240}" python3 scripts/gpu_train_check.py --data .gpu/data --out "$out" --updates 300 \
    --timeout $(( ${TRAIN_S:-240} - 20 )) ${TRAIN_ARGS:-} >"$out/train.log" 2>&1 &
  pids+=($!)
fi
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for f in "$out"/cuda_tests*.log; do tail -n 4 "$f"; done 2>/dev/null; tail -n 20 "$out/train.log" 2>/dev/null
pack

if [[ $stages == *bench* ]]; then
  (cd scripts && timeout "${BENCH_S:-300}" python3 bench_gpu.py --out "$out/results" --autotune "${AUTOTUNE:-first}" ${BENCH_ARGS:-}) >"$out/bench.log" 2>&1 || status=1
  grep -E "^(linformer|ops|lm|decoding) " "$out/bench.log" | tail -n 40
  pack
fi
echo "gpu_run: status $status; results in $out"
exit $status
