#!/usr/bin/env bash
# Reproduces the shipped drafter and its evaluation from a finished `train fit` run (see BENCHMARKS.md for the
# fit / capture commands and budget). Usage: bash benchmarks/ship_drafter.sh runs/dspark/step_300 runs/dflash/step_300
set -euo pipefail
cd "$(dirname "$0")/.."
DSPARK=$1; DFLASH=$2
PY=.venv/bin/python
TARGET=models/qwen2.5-coder-0.5b-instruct
SHIP=models/drafters/dspark-qwen2.5-coder-0.5b-instruct
RES=benchmarks/results
LIMIT=${LIMIT:-4}; TOKENS=${TOKENS:-64}

# STS on held-out cache samples, greedy acceptance labels (the serving default is T=0).
$PY -m sglang_dspark.train calibrate --cache runs/cache --drafter "$DSPARK" --temperature 0 --max-samples 16
mkdir -p "$SHIP"
cp "$DSPARK/config.json" "$DSPARK/model.safetensors" "$DSPARK/sts.json" "$SHIP/"

for T in 0 1; do
  OMP_NUM_THREADS=1 $PY -m sglang_dspark.eval_acceptance --target $TARGET --drafter "$SHIP" --limit $LIMIT \
      --max-new-tokens $TOKENS --temperature $T --json $RES/acceptance_dspark_T$T.json --plots $RES/plots_dspark_T$T &
  OMP_NUM_THREADS=1 $PY -m sglang_dspark.eval_acceptance --target $TARGET --drafter "$DFLASH" --limit $LIMIT \
      --max-new-tokens $TOKENS --temperature $T --json $RES/acceptance_dflash_T$T.json --plots $RES/plots_dflash_T$T &
  wait
done
