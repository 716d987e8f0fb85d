#!/usr/bin/env bash
# The DFlash ablation at equal budget: two drafters trained the same way (warm start from the target's layers, the
# same captured text, the same steps and blocks), differing only in the Markov head (rank 32 = DSpark, 0 = DFlash),
# then eval_acceptance at T = 1 and T = 0 on the eval sets for both. Every stage resumes where it stopped: rerun the
# same command. Both fits run at once on one core each (~3-4 s per step each on a 2-core EPYC Zen 4).
#   bash benchmarks/dflash_ablation.sh            # STEPS=1170 (~300k blocks per arm), SAMPLES=240 text samples
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
TARGET=models/qwen2.5-coder-0.5b-instruct
SHIP=models/drafters/dspark-qwen2.5-coder-0.5b-instruct
WORK=${WORK:-runs/ablation}
STEPS=${STEPS:-1170}; SAMPLES=${SAMPLES:-240}; LIMIT=${LIMIT:-20}; TOKENS=${TOKENS:-64}
mkdir -p "$WORK"

[ -s "$WORK/text.jsonl" ] || $PY -m sglang_dspark.train extra-text --out "$WORK/text.jsonl" --offset 1200 \
    --limit "$SAMPLES" --max-chars 2000 --skip-ids-from ""
$PY -m sglang_dspark.train capture --target $TARGET --data "$WORK/text.jsonl" --out "$WORK/cache" \
    --target-layer-ids 1,11,21 --max-length 1024 --system-prompt '' --dtype bf16 --shard-samples 60
$PY -m sglang_dspark.train targets --cache "$WORK/cache" --top-k 64  # writes only the shards' missing statistics

fit() {  # $1 = arm name, $2 = Markov rank
  OMP_NUM_THREADS=1 $PY -m sglang_dspark.train fit --cache "$WORK/cache" --layers 2 --block-size 7 \
      --intermediate-size 1536 --mask-token-id 151665 --markov-rank "$2" --num-anchors 128 --batch 2 \
      --steps "$STEPS" --lr 6e-4 --warmup-ratio 0.02 --ce-weight 1.0 --l1-weight 0.1 --ce-labels target \
      --vocab-sample-top-k 32 --vocab-sample-negatives 4096 --holdout-fraction 0.05 --save-every 50 \
      --keep-checkpoints 2 --log-every 5 --no-save-shared --save-dtype bf16 --eval-every 100 --eval-samples 8 \
      --eval-anchors 32 --init-from-target --out "$WORK/$1" > "$WORK/$1.log" 2>&1
}
fit dspark 32 & fit dflash 0 & wait

ckpt() { echo "$WORK/$1/$(cat "$WORK/$1/latest")"; }  # `latest` names the newest step folder
for ARM in dspark dflash; do  # both propose from the shipped reduced vocabulary
  cp "$SHIP/draft_vocab.safetensors" "$(ckpt $ARM)/"
done
for T in 1 0; do
  for ARM in dspark dflash; do
    [ -s "$WORK/${ARM}_T$T.json" ] || OMP_NUM_THREADS=1 $PY -m sglang_dspark.eval_acceptance --target $TARGET \
        --drafter "$(ckpt $ARM)" --limit "$LIMIT" --max-new-tokens "$TOKENS" --temperature $T \
        --json "$WORK/${ARM}_T$T.json" &
  done
  wait
done
$PY - "$WORK" <<'EOF'
import json, sys
w = sys.argv[1]
for t in (1, 0):
    a, b = (json.load(open(f"{w}/{arm}_T{t}.json")) for arm in ("dspark", "dflash"))
    per = {k: round(v / b["tau_by_dataset"][k], 3) for k, v in a["tau_by_dataset"].items()}
    print(f"T={t}: tau DSpark {a['tau']:.3f}, DFlash {b['tau']:.3f}, ratio {a['tau'] / b['tau']:.3f} {per}")
EOF
