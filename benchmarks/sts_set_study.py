"""Per-position ECE of one drafter on the eval sets under STS fitted on different prompt sets.

    python benchmarks/sts_set_study.py --report procedural-24=runs/cand/report_eval_T0.json \
        --report eval-dev-24=runs/cand/eval24_T0.json --out benchmarks/results/sts-set-study

Each report is an `eval_acceptance --json` file of the same drafter on the same prompts, scored with a different
sts.json; the raw-confidence ECE and the noise floor come from the first. Writes OUT.json and OUT.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_dspark.bench.machine import describe_machine
from sglang_dspark.train.accumulate import ECE_LIMIT, worst_position_ece


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", action="append", required=True, metavar="NAME=JSON")
    p.add_argument("--out", required=True, help="path without extension")
    args = p.parse_args()
    reports = {}
    for item in args.report:
        name, _, path = item.partition("=")
        reports[name] = json.loads(Path(path).read_text())
    first = next(iter(reports.values()))
    if any(abs(r["tau"] - first["tau"]) > 1e-9 for r in reports.values()):
        raise SystemExit("reports differ in tau: not the same drafter on the same prompts")
    rows = {"raw": first["ece_raw_by_position"]} | {n: r["ece_sts_by_position"] for n, r in reports.items()}
    out = {"machine": describe_machine(), "tau": first["tau"], "tau_by_dataset": first["tau_by_dataset"],
           "ece_by_position": rows, "noise_floor_by_position": first["ece_sts_floor_by_position"],
           "worst_ece_after_sts": {n: worst_position_ece(r) for n, r in reports.items()},
           "sts": {n: {"temperatures": r.get("sts_temperatures"), "biases": r.get("sts_biases")}
                   for n, r in reports.items()}, "ece_limit": ECE_LIMIT,
           "command": "python benchmarks/sts_set_study.py " + " ".join(sys.argv[1:])}
    Path(args.out + ".json").write_text(json.dumps(out, indent=2) + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = range(1, len(first["ece_raw_by_position"]) + 1)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, eces in rows.items():
        ax.plot(pos, [100 * e for e in eces], marker="o", label=name)
    ax.plot(pos, [100 * e for e in out["noise_floor_by_position"]], "k:", label="noise floor")
    ax.axhline(100 * ECE_LIMIT, color="r", lw=0.8, ls="--", label="3% gate")
    ax.set_xlabel("draft position")
    ax.set_ylabel("ECE of prefix survival on the eval sets (%)")
    ax.set_title(f"STS fitted on different prompt sets (tau {first['tau']:.3f})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)
    print(json.dumps(out["worst_ece_after_sts"]))


if __name__ == "__main__":
    main()
