#!/usr/bin/env bash
# Gather into .gpu/ (git-ignored) what a GPU machine without network needs for scripts/gpu_run.sh: the
# CPython 3.12 wheels it lacks (fairseq, hydra, omegaconf, antlr4, bitarray, fla-core, fairscale) and tiny
# binarized data-bins made with the repository's own data tools. Runs here, where the package index is reachable;
# rerunnable (what is there is kept). Needs the .venv of scripts/bootstrap.sh.
#
#   bash scripts/gpu_gather.sh
#   # then, on the GPU machine (it installs the wheels into /tmp and runs everything): bash scripts/gpu_run.sh OUT
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv_py="$root/.venv/bin/python"
gpu="$root/.gpu"
wheels="$gpu/wheels"
data="$gpu/data"
mkdir -p "$wheels" "$data"

# .gpu/ travels with the working tree but must never be committed: ignored locally, not in .gitignore
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
grep -qxF '/.gpu/' "$exclude" || echo '/.gpu/' >>"$exclude"

# ---------------------------------------------------------------------------------------------- wheels
installed_version() {  # the version the local .venv has, so that the GPU runs what the tests here ran
  "$venv_py" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'
}

wheel_prefix() {  # a wheel's file name starts with the project name normalised: lower case, - and . as _
  echo "$1" | tr 'A-Z.-' 'a-z__'
}

have_only() {  # 0 if the wheel of NAME==VERSION is there; wheels of NAME's other versions are removed
  local prefix version="$2" found=1 file
  prefix="$(wheel_prefix "$1")"
  shopt -s nullglob nocaseglob
  for file in "$wheels/$prefix"-*.whl; do
    if [[ "$(basename "$file")" == "$prefix-$version-"* ]]; then found=0; else rm -f "$file"; fi
  done
  shopt -u nullglob nocaseglob
  return $found
}

download() {  # a binary wheel for CPython 3.12 on x86-64 Linux, whatever Python runs this
  local name="$1" version="$2"
  have_only "$name" "$version" && { echo "[gpu-gather] have $name $version"; return; }
  echo "[gpu-gather] downloading $name $version"
  python3 -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$wheels" "$name==$version"
}

build_wheel() {  # NAME VERSION PYTHON [PIP OPTION...]: packages published as source only, built here (pure
  local name="$1" version="$2" python="$3"; shift 3  # Python, so the wheel fits any 3.x)
  have_only "$name" "$version" && { echo "[gpu-gather] have $name $version"; return 0; }
  echo "[gpu-gather] building a wheel of $name $version"
  "$python" -m pip wheel --disable-pip-version-check -q --no-deps "$@" -w "$wheels" "$name==$version"
}

bitarray_version="$(installed_version bitarray)"
antlr_version="$(installed_version antlr4-python3-runtime)"  # hydra-core 1.3.2 requires 4.9.*
: "${bitarray_version:?bitarray is not installed in .venv: run scripts/bootstrap.sh first}"
: "${antlr_version:?antlr4-python3-runtime is not installed in .venv: run scripts/bootstrap.sh first}"

download fairseq-fixed 0.12.3.1
download fla-core 0.6.0
download hydra-core 1.3.2
download omegaconf 2.3.0
download bitarray "$bitarray_version"
# fairseq and omegaconf import these at start-up, and a bare torch image need not have them (small wheels; the big
# ones fairseq imports, scikit-learn and scipy, are left out: gpu_train_check.py stands in for them if missing)
download tqdm "$(installed_version tqdm)"
download PyYAML "$(installed_version PyYAML)"
build_wheel antlr4-python3-runtime "$antlr_version" python3
# fairscale's build imports torch: the .venv's, without an isolated build environment (which would fetch torch)
if ! build_wheel fairscale 0.4.13 "$venv_py" --no-build-isolation; then
  echo "[gpu-gather] fairscale 0.4.13 could not be built into a wheel: FSDP will not be checked on the GPU"
fi

# ---------------------------------------------------------------------------------------------- data
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# monolingual, for --task language_modeling and --task masked_lm: the standard library's docstrings (a few hundred
# KB of text), sentencepiece with 500 pieces
if [ ! -f "$data/lm/dict.txt" ]; then
  echo "[gpu-gather] building the LM data-bin"
  "$venv_py" -m fairseq_linattn.data.stdlib_corpus --out "$tmp/corpus" --max-chars 400000 >/dev/null
  "$venv_py" scripts/prepare_lm_data.py --raw-dir "$tmp/corpus" --destdir "$data/lm" --vocab-size 500 \
    --soft-vocab-limit --workers 2
fi

# English -> German for --task translation: this machine's gettext catalogs; where it has too few, the test
# suite's numbered catalogs (synthetic but well-formed), so that the translation run still has data
if [ ! -f "$data/translation/dict.en.txt" ]; then
  echo "[gpu-gather] building the translation data-bin"
  if ! "$venv_py" scripts/prepare_translation_data.py --destdir "$data/translation" --vocab-size 500; then
    echo "[gpu-gather] too few message catalogs here: using synthetic catalogs (tests/data/mo_files.py)"
    "$venv_py" -c "import sys; from pathlib import Path; from tests.data.mo_files import numbered_catalogs;
numbered_catalogs(Path(sys.argv[1]), catalogs=40, per_catalog=150)" "$tmp/locale"
    "$venv_py" scripts/prepare_translation_data.py --destdir "$data/translation" --vocab-size 500 \
      --locale-dir "$tmp/locale" --min-pairs 1000
  fi
fi
rm -rf "$data/translation/raw"  # the detokenised text, for sacrebleu: 4 MB that training does not read

# ---------------------------------------------------------------------------------------------- sizes
du -sh "$wheels"/* "$data"/*
total_kb="$(du -sk "$gpu" | cut -f1)"
if [ "$total_kb" -gt $((40 * 1024)) ]; then
  echo "[gpu-gather] .gpu/ holds ${total_kb} KB, more than the 40 MiB it may carry" >&2
  exit 1
fi
echo "[gpu-gather] ready: $gpu (${total_kb} KB)"
