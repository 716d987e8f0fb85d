"""`python -m sglang_dspark.bench repeats`: error bars from repeated `bench serve` runs.

One serving run on this 2-core box moves ±10–15% from run to run, so "dspark >= 0.97 x none" cannot be read off a
single row. Run `bench serve` K times into K files (--out serve_rep1.json ...), then this command pools them: per
(policy, concurrency, temperature) the mean and standard error of aggregate tok/s, and for each policy the ratio to
a reference policy with a 95% interval (ratio of means, delta method over the two standard errors). Writes
benchmarks/results/<out> and a PNG of the ratios with their intervals.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

from sglang_dspark.bench.report import RESULTS_DIR, markdown_table, shown_path

Z95 = 1.96


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", help="serve JSON files (one per repeat)")
    p.add_argument("--reference", default="none", help="policy the others are divided by")
    p.add_argument("--metric", default="aggregate_tok_s")
    p.add_argument("--out", default="serve_repeats.json", help="name under benchmarks/results")
    p.add_argument("--no-plots", action="store_true")


def _rows(path: str) -> list[dict]:
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, list) else data.get("rows", [])


def mean_sem(values: list[float]) -> tuple[float, float]:
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, float("nan")
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    return m, math.sqrt(var / n)


def ratio_interval(num: tuple[float, float], den: tuple[float, float]) -> tuple[float, float, float]:
    """Ratio of two means with a 95% interval from the delta method: se(r)/r = sqrt((se_a/a)^2 + (se_b/b)^2)."""
    (a, sa), (b, sb) = num, den
    r = a / b
    if math.isnan(sa) or math.isnan(sb):
        return r, float("nan"), float("nan")
    rel = math.sqrt((sa / a) ** 2 + (sb / b) ** 2)
    return r, r * (1 - Z95 * rel), r * (1 + Z95 * rel)


def pool(files: list[str], metric: str, reference: str) -> list[dict]:
    samples: dict[tuple, list[float]] = defaultdict(list)
    for f in files:
        for row in _rows(f):
            if row.get(metric) is not None:
                samples[(row["policy"], int(row["concurrency"]), float(row["temperature"]))].append(float(row[metric]))
    stats = {k: mean_sem(v) for k, v in samples.items()}
    out = []
    for (policy, c, t), (m, se) in sorted(stats.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        row = {"policy": policy, "concurrency": c, "temperature": t, "runs": len(samples[(policy, c, t)]),
               f"{metric}_mean": m, f"{metric}_sem": se}
        ref = stats.get((reference, c, t))
        if ref is not None and policy != reference:
            r, lo, hi = ratio_interval((m, se), ref)
            row.update({f"ratio_vs_{reference}": r, "ratio_lo95": lo, "ratio_hi95": hi})
        out.append(row)
    return out


def plot(rows: list[dict], reference: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    key = f"ratio_vs_{reference}"
    for (policy, t) in sorted({(r["policy"], r["temperature"]) for r in rows if key in r}):
        pts = sorted((r["concurrency"], r[key], r["ratio_lo95"], r["ratio_hi95"]) for r in rows
                     if r["policy"] == policy and r["temperature"] == t and key in r)
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        err = [[max(0.0, p[1] - p[2]) if not math.isnan(p[2]) else 0 for p in pts],
               [max(0.0, p[3] - p[1]) if not math.isnan(p[3]) else 0 for p in pts]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{policy} T={t:g}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.97, color="r", lw=0.8, ls="--", label="0.97")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel(f"aggregate tok/s / {reference}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> list[dict]:
    rows = pool(args.files, args.metric, args.reference)
    out = RESULTS_DIR / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"files": args.files, "reference": args.reference, "rows": rows}, indent=2) + "\n")
    cols = ["policy", "concurrency", "temperature", "runs", f"{args.metric}_mean", f"{args.metric}_sem",
            f"ratio_vs_{args.reference}", "ratio_lo95", "ratio_hi95"]
    print(markdown_table(rows, cols))
    print(f"[repeats] wrote {shown_path(out)}")
    if not args.no_plots:
        plot(rows, args.reference, out.with_suffix(".png"))
    return rows
