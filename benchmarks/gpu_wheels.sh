#!/usr/bin/env bash
# Run HERE (CPU box, PyPI reachable) before a lent-GPU call: fetches FlashInfer and the dependencies the H200
# image lacks into .whl/ (git-ignored, ~22 MB), which `run` carries. Then, with the device tool:
#   run(carry=[".whl"], command="bash benchmarks/gpu_session.sh", timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .whl
for spec in "flashinfer-python==0.6.1" "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8,!=0.1.8.post0" "nvidia-cudnn-frontend>=1.13.0"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$spec"
done
ls -la .whl
