#!/usr/bin/env bash
# The measurement chain after a drafter fit (as run on 2026-11-30), in order; each step resumes or is cheap to redo.
#   1. ship the DSpark checkpoint (STS calibration + copy) and evaluate both drafters offline (tau, ECE);
#   2. serving sweep on the quiet machine (nothing else running!), traces for the simulator;
#   3. simulator + its validation against the serving rows.
# Usage: bash benchmarks/after_training.sh runs/dspark/step_N runs/dflash/step_N [stage...]
set -euo pipefail
cd "$(dirname "$0")/.."
DSPARK=$1; DFLASH=$2; shift 2
STAGES=${*:-ship serve sim}
PY=.venv/bin/python
for stage in $STAGES; do
  case $stage in
    ship)
      bash benchmarks/ship_drafter.sh "$DSPARK" "$DFLASH"
      $PY -m sglang_dspark.bench acceptance_report ;;
    serve)
      $PY -m sglang_dspark.bench serve --policies none,ngram,fixed:1,fixed:3,fixed:7,threshold:0.5,sps-topk,dspark,dspark-async \
          --concurrency 1 4 16 --temperatures 0 1 --max-tokens 64 --out benchmarks/results/serve.json --force ;;
    sim)
      $PY -m sglang_dspark.bench sim --trace "benchmarks/results/traces/*/*_T0.jsonl" \
          --validate benchmarks/results/serve.json --out benchmarks/results/sim.json ;;
  esac
done
