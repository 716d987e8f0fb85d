"""`python -m sglang_dspark.bench acceptance_report`: the tau table (DSpark vs DFlash ablation, per dataset, T=0 and
T=1) and the per-position acceptance plot, from the eval_acceptance JSON files."""

from __future__ import annotations

import argparse
import json

from sglang_dspark.bench.report import RESULTS_DIR, markdown_table, update_section


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default=str(RESULTS_DIR))
    # "1_dt0": T = 1 with greedy drafts, the server's default (--dspark-draft-temperature 0)
    p.add_argument("--temperatures", nargs="+", default=["0", "1", "1_dt0"])


def _label(T: str) -> str:
    return "1, greedy drafts (served)" if T == "1_dt0" else T


def run(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, curves = [], {}
    for T in args.temperatures:
        for name in ("dspark", "dflash"):
            path = f"{args.results}/acceptance_{name}_T{T}.json"
            try:
                with open(path) as f:
                    r = json.load(f)
            except FileNotFoundError:
                continue
            row = {"drafter": name, "T": _label(T), "tau (all)": r["tau"]}
            row.update({f"tau {k}": v for k, v in r["tau_by_dataset"].items()})
            row.update({"ece_raw": r.get("ece_raw"), "ece_sts": r.get("ece_sts"), "auc": r.get("auc")})
            by_pos, floors = r.get("ece_sts_by_position"), r.get("ece_sts_floor_by_position")
            if by_pos and any(e is not None for e in by_pos):
                worst = max((k for k, e in enumerate(by_pos) if e is not None), key=lambda k: by_pos[k])
                row["worst position ece_sts"] = f"{by_pos[worst]:.4f} (pos {worst + 1})"
                if floors and floors[worst] is not None:  # the ECE of perfect calibration on as many rounds
                    row["its noise floor"] = round(floors[worst], 4)
            row["rounds"] = r.get("rounds")
            rows.append(row)
            curves[(name, T)] = r["cond_accept_by_position"]
    if not rows:
        raise SystemExit("no acceptance_*.json found")
    fig, axes = plt.subplots(1, len(args.temperatures), figsize=(5 * len(args.temperatures), 3.5), squeeze=False)
    for ax, T in zip(axes[0], args.temperatures):
        for name, style in (("dspark", "o-"), ("dflash", "s--")):
            if (name, T) in curves:
                c = [float("nan") if x is None else x for x in curves[(name, T)]]  # never-reached positions
                ax.plot(range(1, len(c) + 1), c, style, label=name)
        ax.set_title(f"conditional acceptance by position, T={_label(T)}", fontsize=9)
        ax.set_xlabel("draft position")
        ax.set_ylim(0, 1)
        ax.legend()
    fig.tight_layout()
    png = f"{args.results}/acceptance_by_position.png"
    fig.savefig(png, dpi=120)
    cols = list(dict.fromkeys(k for r in rows for k in r))
    update_section("acceptance", "Command: `bash benchmarks/ship_drafter.sh RUN/step_N ABLATION/step_N` then "
                   "`python -m sglang_dspark.bench acceptance_report`. Per-position plot: "
                   "`benchmarks/results/acceptance_by_position.png`; reliability diagrams: "
                   "`benchmarks/results/plots_dspark_T*/reliability.png`.\n\n" + markdown_table(rows, cols))
    print(markdown_table(rows, cols))
