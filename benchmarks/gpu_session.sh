#!/usr/bin/env bash
# Run ON the lent GPU (see benchmarks/gpu_wheels.sh): one call that checks every kernel against its torch
# reference (pytest, CUDA cases) and times them (benchmarks/kernels.py). Everything lands in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -c "import flashinfer; print('flashinfer', flashinfer.__version__)" 2>&1 | tail -1 | tee -a "$OUT/gpu.txt"
# kernel tests first (the static FlashInfer path's test is the newest), then the timings
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_kernels_flashinfer_static_verify.py \
  tests/unit/test_kernels_flashinfer_verify.py tests/unit/test_kernels_markov_sampler.py \
  tests/unit/test_kernels_ragged_accept.py 2>&1 | tee "$OUT/kernel_tests.log" | tail -15
timeout 240 python3 benchmarks/kernels.py --out "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.log" | tail -60
