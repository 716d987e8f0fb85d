"""Which confidence prior serves the n-gram table's drafts best on prompt sets the table never saw: the built-in
grade prior, a prior fitted on random held-out seed answers, or one fitted leave-family-out (every seed answer scored
against a table of the other prompt families), each scored on eval-set answers the way a server meets them.

    python benchmarks/table_prior_study.py --seed runs/seed/proc.jsonl runs/seed/train.jsonl \
        --eval runs/seed/eval.jsonl --out benchmarks/results/table-prior-study-<cpu>-<date>

The table the eval answers are walked against is built from every seed answer (what the server ships); eval answers
are only scored, never fitted on. Per variant: per-position ECE of predicted prefix survival and the log-loss per
verified position, with the prior frozen and refined online (as served).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from retrieval_prior_study import plot_ece, walk  # noqa: E402

from sglang_dspark.bench.machine import describe_machine  # noqa: E402
from sglang_dspark.retrieval import NgramTable  # noqa: E402
from sglang_dspark.retrieval.confidence import RetrievalConfidence, fit_table  # noqa: E402


def main() -> None:
    from transformers import AutoTokenizer

    from sglang_dspark.embedded import DEFAULT_TARGET_DIR
    from sglang_dspark.eval.retrieval_prior import conversation_rows, table_proposers

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", nargs="+", required=True, help="greedy answers to training prompts (the table)")
    p.add_argument("--eval", nargs="+", required=True, help="greedy answers to eval prompts (scored only)")
    p.add_argument("--model", default=str(DEFAULT_TARGET_DIR))
    p.add_argument("--gamma", type=int, default=7)
    p.add_argument("--out", required=True, help="output stem: <out>.json and <out>.png")
    args = p.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model)
    seed, evals = conversation_rows(tok, args.seed), conversation_rows(tok, args.eval)
    G = args.gamma
    full = NgramTable.build([o for _, _, o in seed])

    def fitted(fit: str):
        scored, proposers = table_proposers(seed, fit, 0.1)
        return lambda: fit_table(scored, G, source="table", proposers=proposers)

    variants = {"built-in grade prior": lambda: RetrievalConfidence(G, sources=("table",)),
                "fitted, random 10% held out": fitted("holdout"),
                "fitted, leave-family-out": fitted("leave-family-out")}
    scored = [(p_, o) for _, p_, o in evals]
    rows = []
    for name, make in variants.items():
        conf = make()
        prior = conf.table["table"].copy()
        for online in (False, True):
            conf.table["table"] = prior.copy()
            r = walk(conf, scored, G, True, online, source="table",
                     propose=lambda ctx, n: full.candidate(ctx, n, source=3))
            rows.append({"variant": name, "online": online, **r})
            print(f"{name:30s} {'online' if online else 'frozen'}: ECE "
                  f"{[round(e, 3) for e in r['ece_by_position']]} log-loss {r['logloss_per_position']:.4f}",
                  flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"command": "python " + " ".join(sys.argv), "machine": describe_machine(),
              "seed": [Path(s).name for s in args.seed], "seed_families": sorted({f for f, _, _ in seed}),
              "seed_answers": len(seed), "table_tokens": full.tokens, "eval": [Path(e).name for e in args.eval],
              "eval_answers": len(evals), "gamma": G, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))

    plot_ece(rows, G, "ECE of prefix survival (eval answers)", f"n-gram table prior: {len(evals)} eval answers, table "
             f"of {full.tokens} seed tokens; {describe_machine()}", out.with_suffix(".png"))

if __name__ == "__main__":
    main()
