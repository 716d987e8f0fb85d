"""Which retrieval-confidence prior serves best: fitted priors against the built-in one, with and without the
request-history axis, scored the way a server uses them, on greedy answers the prior was not fitted on.

    python benchmarks/retrieval_prior_study.py --conversations runs/data/generated.jsonl --out benchmarks/results/retrieval-prior-study

Answers (`train generate --temperature 0` rows) are split in two by position (even rows fit, odd rows score). Each
scored answer is walked as a T = 0 server steps through it: the prompt-lookup chain at the current position is
verified whole, the walk moves past the accepted drafts and the bonus token. Per variant: the per-position ECE of
predicted prefix survival and the log-loss per verified position, once with the prior frozen and once refined
online (every outcome updates its cell before the next prediction, as in serving).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_dspark.bench.machine import describe_machine
from sglang_dspark.retrieval.confidence import ECE_BINS, HISTORY_NONE, RetrievalConfidence, fit_table, served_chains


def walk(conf: RetrievalConfidence, seqs, gamma: int, use_history: bool, online: bool, source: str = "prompt",
         propose=None) -> dict:
    """Per-position ECE of predicted prefix survival and log-loss of `source`'s chains (drawn by propose, default
    prompt lookup) as a T = 0 server meets them in each answer."""
    pred = [[] for _ in range(gamma)]
    label = [[] for _ in range(gamma)]
    loss, positions = 0.0, 0
    for prompt, output in seqs:
        for cand, n, accepted, hist in served_chains(prompt, output, gamma, propose=propose):
            h = hist if use_history else HISTORY_NONE
            extra = {"match_lens": cand.match_lens, "counts": cand.counts}
            p = conf.probs(source, cand.match_len, cand.count, n, h, **extra)
            surv = np.cumprod(p)
            for k in range(n):
                pred[k].append(float(surv[k]))
                label[k].append(k < accepted)
            reached = min(accepted + 1, n)  # positions whose conditional was put to the test
            y = (np.arange(reached) < accepted).astype(float)
            q = np.clip(p[:reached], 1e-6, 1 - 1e-6)
            loss -= float((y * np.log(q) + (1 - y) * np.log(1 - q)).sum())
            positions += reached
            if online:
                conf.observe(source, cand.match_len, cand.count, p, n, accepted, h, **extra)
    ece = []
    for pr, lb in zip(pred, label):
        pr, lb = np.asarray(pr), np.asarray(lb, dtype=float)
        bins = np.clip((pr * ECE_BINS).astype(int), 0, ECE_BINS - 1)
        ece.append(float(np.abs(np.bincount(bins, weights=pr - lb, minlength=ECE_BINS)).sum() / max(1, pr.size)))
    return {"ece_by_position": ece, "logloss_per_position": loss / max(1, positions), "positions": positions}


def plot_ece(rows: list[dict], gamma: int, ylabel: str, title: str, path: Path) -> None:
    """Per-position ECE of every variant, frozen prior beside online-refined one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, online in zip(axes, (False, True)):
        for r in rows:
            if r["online"] == online:
                ax.plot(range(1, gamma + 1), r["ece_by_position"], marker="o",
                        label=f"{r['variant']} (log-loss {r['logloss_per_position']:.3f})")
        ax.axhline(0.03, color="grey", ls="--", lw=0.8)
        ax.set(xlabel="draft position", title="prior refined online" if online else "prior frozen")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes[0].set_ylabel(ylabel)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    from transformers import AutoTokenizer

    from sglang_dspark.embedded import DEFAULT_TARGET_DIR
    from sglang_dspark.eval.retrieval_prior import conversation_sequences

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conversations", nargs="+", required=True)
    p.add_argument("--model", default=str(DEFAULT_TARGET_DIR))
    p.add_argument("--gamma", type=int, default=7)
    p.add_argument("--out", required=True, help="output stem: <out>.json and <out>.png")
    args = p.parse_args()
    seqs = conversation_sequences(AutoTokenizer.from_pretrained(args.model), args.conversations)
    fit, score = seqs[0::2], seqs[1::2]
    G = args.gamma
    variants = {  # name -> (prior factory, history axis used)
        "built-in prior": (lambda: RetrievalConfidence(G, sources=("prompt",)), False),
        "built-in prior + history": (lambda: RetrievalConfidence(G, sources=("prompt",)), True),
        "fitted, cap 200": (lambda: fit_table(fit, G, max_prior=200.0), False),
        "fitted, cap 200 + history": (lambda: fit_table(fit, G, max_prior=200.0), True),
        "fitted, cap 8": (lambda: fit_table(fit, G, max_prior=8.0), False),
        "fitted, cap 8 + history": (lambda: fit_table(fit, G, max_prior=8.0), True),
    }
    rows = []
    for name, (make, hist) in variants.items():
        for online in (False, True):
            r = walk(make(), score, G, hist, online)
            rows.append({"variant": name, "online": online, **r})
            print(f"{name:28s} {'online' if online else 'frozen'}: ECE "
                  f"{[round(e, 3) for e in r['ece_by_position']]} log-loss {r['logloss_per_position']:.4f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": describe_machine(), "conversations": [Path(c).name for c in args.conversations],
              "fit_answers": len(fit), "scored_answers": len(score), "gamma": G, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))

    plot_ece(rows, G, "ECE of prefix survival (held-out answers)",
             f"retrieval prior study: {len(score)} held-out greedy answers; {describe_machine()}",
             out.with_suffix(".png"))

if __name__ == "__main__":
    main()
