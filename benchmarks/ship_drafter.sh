#!/usr/bin/env bash
# Reproduces the shipped drafter and its evaluation from a finished `train fit` run (see docs/benchmark-log.md for the
# fit / capture commands and budget). Usage: bash benchmarks/ship_drafter.sh runs/dspark/step_300 runs/dflash/step_300
set -euo pipefail
cd "$(dirname "$0")/.."
DSPARK=$1; DFLASH=$2
PY=.venv/bin/python
TARGET=models/qwen2.5-coder-0.5b-instruct
SHIP=models/drafters/dspark-qwen2.5-coder-0.5b-instruct
RES=benchmarks/results
LIMIT=${LIMIT:-20}; TOKENS=${TOKENS:-64}

# The reduced draft vocabulary, then STS per regime fitted on free-running speculative decoding (the way the
# server drafts) of 48 training prompts the drafter never saw; greedy labels for T=0 requests, T=1 rejection
# sampling for sampled ones. Affine form (temperature + bias per position, drafter/sts.py) by default.
$PY -m sglang_dspark.train draft-vocab --data runs/data/generated.jsonl --data runs/data/extra_text.jsonl \
    --drafter "$DSPARK" --size 32768
mkdir -p "$SHIP"
cp "$DSPARK/config.json" "$DSPARK/model.safetensors" "$DSPARK/draft_vocab.safetensors" "$SHIP/"
rm -f "$SHIP/sts.json"
TR=../shared/data/train
# the sampled set is fitted the way the server drafts at T > 0: greedy drafts (--dspark-draft-temperature 0)
for T in 0 1; do
  $PY -m sglang_dspark.eval_acceptance --drafter "$SHIP" --dataset $TR/livecodebench.jsonl \
      --dataset $TR/arena-hard-v2.jsonl --dataset $TR/lbpp.jsonl --limit 16 --max-new-tokens 64 \
      --exclude-prompts runs/data/generated.jsonl --temperature $T --draft-temperature 0 --fit-sts "$SHIP/sts.json" \
      --json runs/sts_fit_T$T.json
done
# like-for-like ablation: the DFlash drafter proposes from the same reduced vocabulary
cp "$DSPARK/draft_vocab.safetensors" "$DFLASH/"

for T in 0 1; do
  OMP_NUM_THREADS=1 $PY -m sglang_dspark.eval_acceptance --target $TARGET --drafter "$SHIP" --limit $LIMIT \
      --max-new-tokens $TOKENS --temperature $T --json $RES/acceptance_dspark_T$T.json --plots $RES/plots_dspark_T$T &
  OMP_NUM_THREADS=1 $PY -m sglang_dspark.eval_acceptance --target $TARGET --drafter "$DFLASH" --limit $LIMIT \
      --max-new-tokens $TOKENS --temperature $T --json $RES/acceptance_dflash_T$T.json --plots $RES/plots_dflash_T$T &
  wait
done
# the served T=1 configuration (greedy drafts), with its calibration
$PY -m sglang_dspark.eval_acceptance --target $TARGET --drafter "$SHIP" --limit $LIMIT --max-new-tokens $TOKENS \
    --temperature 1 --draft-temperature 0 --json $RES/acceptance_dspark_T1_dt0.json --plots $RES/plots_dspark_T1_dt0
