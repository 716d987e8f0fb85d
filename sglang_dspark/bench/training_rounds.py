"""Accumulated training rounds of a drafter (`<drafter>/training/curve.jsonl`, written by `train continue`): tau
per round against blocks trained and CPU-hours, one line per eval setting, shipped rounds filled."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .machine import describe_machine


def add_args(p: argparse.ArgumentParser) -> None:
    from ..embedded import DEFAULT_DRAFTER_DIR

    p.add_argument("--drafter", default=str(DEFAULT_DRAFTER_DIR))
    p.add_argument("--out", required=True, help="output stem: writes <out>.json and <out>.png")


def setting_name(row: dict) -> str:
    e = row.get("eval") or {}
    return f"{e.get('dtype', '?')}, {e.get('limit', '?')} prompts/dataset, {e.get('tokens', '?')} tokens"


def group_rounds(curve: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for r in curve:
        groups.setdefault(setting_name(r), []).append(
            {k: r.get(k) for k in ("date", "cpu", "baseline", "data_mode", "prompts", "blocks", "cpu_hours", "tau",
                                   "tau_by_dataset", "worst_ece", "shipped", "why")})
    return groups


def run(args: argparse.Namespace) -> dict:
    from ..train.accumulate import read_curve

    curve = read_curve(args.drafter)
    if not curve:
        raise SystemExit(f"{args.drafter}: no training/curve.jsonl rows")
    groups = group_rounds(curve)
    report = {"machine": describe_machine(), "drafter": args.drafter, "settings": groups}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, rows in groups.items():
        for ax, key in zip(axes, ("blocks", "cpu_hours")):
            line, = ax.plot([r[key] for r in rows], [r["tau"] for r in rows], marker="o", mfc="none", label=name)
            shipped = [r for r in rows if r["shipped"]]
            ax.plot([r[key] for r in shipped], [r["tau"] for r in shipped], "o", color=line.get_color())
    axes[0].set(xlabel="blocks trained in accumulated rounds", ylabel="tau (eval_acceptance, T = 0)")
    axes[1].set(xlabel="CPU-hours of accumulated rounds", ylabel="tau (eval_acceptance, T = 0)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="filled: shipped", title_fontsize=7)
    fig.suptitle(f"{Path(args.drafter).name}: accumulated training rounds", fontsize=9)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    print(f"{len(curve)} rounds in {len(groups)} eval settings -> {out.with_suffix('.json')}, {out.with_suffix('.png')}")
    return report
