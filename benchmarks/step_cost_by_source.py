"""What each kind of decode step costs and returns, from a DSPARK_EXT server's step trace at one request per step
(`bench ab` keeps them as <out stem>_traces/<policy>.jsonl): plain steps, and verify steps by the source of the
verified drafts (drafter, prompt lookup, corpus, n-gram table). Per kind: steps, tokens committed per step
(accepted + 1), the median draft pass, forward and scheduler gap (time between two steps beyond the two, prefills
excluded), and tokens per plain-step-equivalent: (accepted + 1) / (step time / median plain step time). A kind
above 1 pays for itself at this load, one below 1 loses against plain decoding.

    python benchmarks/step_cost_by_source.py TRACE.jsonl --out benchmarks/results/step-cost-by-source-DATE-CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

KINDS = ("plain", "drafter", "prompt", "corpus", "table", "verified nothing")
MAX_GAP_S = 0.5  # a longer gap between two steps holds a prefill or an idle wait, not per-step scheduler work


def kind(row: dict) -> str | None:
    if len(row.get("verify_lens", [])) != 1:
        return None  # this reading is for one request per step
    if row.get("plain"):
        return "plain"
    src = (row.get("sources") or [-1])[0]
    if row["verify_lens"][0] == 0 or src < 0:
        return "verified nothing"
    return ("drafter", "prompt", "corpus", "table")[src]


def summarise(rows: list[dict]) -> dict:
    per: dict[str, dict[str, list]] = {k: {"draft": [], "forward": [], "gap": [], "tokens": []} for k in KINDS}
    prev_t = None
    for row in rows:
        k = kind(row)
        step_s = row["draft_s"] + row["verify_s"]
        gap = None if prev_t is None else row["t"] - prev_t - step_s
        prev_t = row["t"]
        if k is None:
            continue
        acc = per[k]
        acc["draft"].append(row["draft_s"])
        acc["forward"].append(row["verify_s"])
        acc["tokens"].append(1 + row["accept_lens"][0])
        if gap is not None and 0 <= gap < MAX_GAP_S:
            acc["gap"].append(gap)
    med = {k: {m: (statistics.median(v) if v else None) for m, v in acc.items()} for k, acc in per.items()}
    plain_step = None
    if per["plain"]["forward"]:
        plain_step = med["plain"]["forward"] + (med["plain"]["gap"] or 0.0)
    out = {}
    for k, acc in per.items():
        n = len(acc["tokens"])
        if not n:
            continue
        m = med[k]
        step = (m["draft"] or 0.0) + m["forward"] + (m["gap"] or 0.0)
        tokens = sum(acc["tokens"]) / n
        out[k] = {"steps": n, "tokens_per_step": round(tokens, 3), "draft_ms": round(1e3 * (m["draft"] or 0), 2),
                  "forward_ms": round(1e3 * m["forward"], 2), "gap_ms": round(1e3 * (m["gap"] or 0), 2),
                  "step_ms": round(1e3 * step, 2),
                  "cost_vs_plain": round(step / plain_step, 3) if plain_step else None,
                  "tokens_per_plain_step": round(tokens * plain_step / step, 3) if plain_step else None}
    return out


def plot(table: dict, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k in KINDS if k in table]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = range(len(kinds))
    ax.bar([i - 0.2 for i in x], [table[k]["tokens_per_step"] for k in kinds], 0.4, label="tokens per step")
    ax.bar([i + 0.2 for i in x], [table[k]["cost_vs_plain"] or 0 for k in kinds], 0.4, label="step cost / plain step")
    for i, k in enumerate(kinds):
        ax.annotate(f"{table[k]['tokens_per_plain_step']}\n({table[k]['steps']} steps)", (i, 0.05), ha="center",
                    fontsize=7, color="white")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xticks(list(x), kinds)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a step trace (JSONL) recorded at one request per step")
    p.add_argument("--out", default=None, help="output stem: OUT.json, OUT.png")
    p.add_argument("--title", default=None)
    args = p.parse_args()
    rows = [json.loads(line) for line in Path(args.trace).read_text().splitlines() if line.strip()]
    if rows and "sources" not in rows[0]:
        raise SystemExit(f"{args.trace}: the trace has no per-row sources (recorded before they were traced)")
    table = summarise(rows)
    print(json.dumps(table, indent=1))
    if args.out:
        out = Path(args.out)
        out.with_suffix(".json").write_text(json.dumps({"trace": args.trace, "command": "python " + " ".join(sys.argv),
                                                        "kinds": table}, indent=1))
        plot(table, args.title or f"Decode steps by kind: {args.trace}", out.with_suffix(".png"))


if __name__ == "__main__":
    main()
