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

# STS on the held-out split (the fit's --holdout-fraction), one temperature set per regime: greedy labels for
# T=0 requests, T=1 rejection-sampling labels for sampled ones; then the reduced draft vocabulary.
$PY -m sglang_dspark.train calibrate --cache runs/cache --drafter "$DSPARK" --temperature 0 --holdout-fraction 0.1
$PY -m sglang_dspark.train calibrate --cache runs/cache --drafter "$DSPARK" --temperature 1 --holdout-fraction 0.1
$PY -m sglang_dspark.train draft-vocab --data runs/data/generated.jsonl --data runs/data/extra_text.jsonl \
    --drafter "$DSPARK" --size 32768
mkdir -p "$SHIP"
cp "$DSPARK/config.json" "$DSPARK/model.safetensors" "$DSPARK/sts.json" "$DSPARK/draft_vocab.safetensors" "$SHIP/"
# like-for-like ablation: the DFlash drafter proposes from the same reduced vocabulary
cp "$DSPARK/draft_vocab.safetensors" "$DFLASH/"

for T in 0 1; do
  OMP_NUM_THREADS=1 $PY -m sglang_dspark.eval_acceptance --target $TARGET --drafter "$SHIP" --limit $LIMIT \
      --max-new-tokens $TOKENS --temperature $T --json $RES/acceptance_dspark_T$T.json --plots $RES/plots_dspark_T$T &
  OMP_NUM_THREADS=1 $PY -m sglang_dspark.eval_acceptance --target $TARGET --drafter "$DFLASH" --limit $LIMIT \
      --max-new-tokens $TOKENS --temperature $T --json $RES/acceptance_dflash_T$T.json --plots $RES/plots_dflash_T$T &
  wait
done
