"""Learning curves of `train fit` runs side by side: held-out tau and training top-1 against blocks trained."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .machine import describe_machine


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", action="append", required=True, metavar="NAME=DIR",
                   help="a fit output directory (its train_log.jsonl); repeatable")
    p.add_argument("--out", required=True, help="output stem: writes <out>.json and <out>.png")
    p.add_argument("--smooth", type=int, default=20, help="training top-1: moving average over this many logs")
    p.add_argument("--note", default="", help="free text stored in the JSON (data, flags)")


def read_curve(run_dir: str, smooth: int) -> dict:
    rows = [json.loads(x) for x in (Path(run_dir) / "train_log.jsonl").read_text().splitlines() if x.strip()]
    evals = [r for r in rows if "heldout_tau" in r]
    train = [r for r in rows if "top1" in r]
    top1 = []
    for i, r in enumerate(train):
        window = train[max(0, i - smooth + 1): i + 1]
        top1.append(sum(w["top1"] for w in window) / len(window))
    return {"dir": run_dir,
            "eval": [{"step": r["step"], "blocks": r["blocks"], "tau": r["heldout_tau"],
                      "first_accept": r["heldout_top1"]} for r in evals],
            "train": [{"step": r["step"], "blocks": r["blocks"], "top1_smoothed": t} for r, t in zip(train, top1)]}


def run(args: argparse.Namespace) -> dict:
    curves = {}
    for spec in args.run:
        name, _, d = spec.partition("=")
        curves[name] = read_curve(d, args.smooth)
    report = {"machine": describe_machine(), "note": args.note, "curves": curves}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, c in curves.items():
        a.plot([e["blocks"] for e in c["eval"]], [e["tau"] for e in c["eval"]], marker="o", label=name)
        b.plot([t["blocks"] for t in c["train"]], [t["top1_smoothed"] for t in c["train"]], label=name)
    a.set(xlabel="blocks trained", ylabel="held-out tau (greedy, full block)", title="offline acceptance length")
    b.set(xlabel="blocks trained", ylabel=f"training top-1 (moving avg {args.smooth})", title="training top-1")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(describe_machine(), fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return report
