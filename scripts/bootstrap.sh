#!/usr/bin/env bash
# Create (or reuse) the virtual environment in .venv and install what the plugin needs.
# Order matters: torch first (the local CPU wheel), then fairseq-fixed with --no-build-isolation
# (its build asks for torch; an isolated build would pull a multi-GB CUDA torch), then the plugin.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null || py=python3

# a setup interrupted while the venv was being made leaves one without pip: make it again rather than fail on it
if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  echo "[bootstrap] $venv has no pip (an interrupted setup?): making it again"
  rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating $venv"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "[bootstrap] installing torch 2.13.0 (CPU)"
  "${pip[@]}" install --upgrade pip setuptools wheel
  "${pip[@]}" install torch==2.13.0 numpy cython
fi
if ! "$venv/bin/python" -c "import fairseq" 2>/dev/null; then
  echo "[bootstrap] installing fairseq-fixed 0.12.3.1 (compiles its extensions: ~3 minutes)"
  "${pip[@]}" install cython numpy setuptools wheel
  "${pip[@]}" install --no-build-isolation fairseq-fixed==0.12.3.1
fi
if ! "$venv/bin/python" -c "import fairseq_linattn, sentencepiece, sacrebleu, matplotlib, pytest, xdist, fairscale" 2>/dev/null \
    || [ ! -x "$venv/bin/ruff" ]; then
  echo "[bootstrap] installing the plugin and its tools"
  "${pip[@]}" install --no-build-isolation -e "$root[dev]"
fi
echo "[bootstrap] ready: $venv"
