"""Served calibration of the retrieval confidences: one default DSPARK_EXT server (drafter + prompt lookup + corpus,
--enable-metrics) answers eval-mix prompts for a time budget, and its /metrics are read after every chunk of
requests: per source and draft position the ECE over every prediction served since start-up
(sglang:dspark_retrieval_ece_served), its label-noise floor and the predictions behind it, beside the 1024-window
reading. A c = 1 A/B verifies a few hundred chains per position, where the floor alone is ~9%; this run verifies
thousands.

    python benchmarks/served_retrieval_ece.py --minutes 40 --out benchmarks/results/served-retrieval-ece-DATE-CPU

Writes OUT.json after every chunk (an interrupted run keeps its last reading; the confidences live in the server, so
a rerun starts over) and OUT.png at the end. Not a timing benchmark: calibration does not depend on the CPU's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_dspark.bench.ab import scrape_retrieval_ece, scrape_step_counts  # noqa: E402
from sglang_dspark.bench.load import LoadResult, run_load_sync  # noqa: E402
from sglang_dspark.bench.machine import describe_machine  # noqa: E402
from sglang_dspark.bench.prompts import eval_mix  # noqa: E402
from sglang_dspark.bench.server import ServerProcess  # noqa: E402
from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR  # noqa: E402

METRICS = ("retrieval_ece_served", "retrieval_ece_served_floor", "retrieval_predictions", "retrieval_ece",
           "retrieval_ece_floor")


def reading(url: str) -> dict:
    """{metric: {source: {position: value}}} plus the step counters, from the server's /metrics."""
    return {**{m: scrape_retrieval_ece(url, m) for m in METRICS}, "step_counts": scrape_step_counts(url)}


def by_source(results) -> dict:
    """Summed per-request `dspark.by_source` records: steps, verified and accepted drafts, tau per source."""
    out = LoadResult(1, 0.0, list(results)).summary().get("by_source", {})
    for acc in out.values():
        acc["tau"] = round(1 + acc["accepted"] / acc["steps"], 4) if acc["steps"] else None
    return out


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = data["reading"]
    sources = sorted(last.get("retrieval_ece_served", {}))
    fig, axes = plt.subplots(1, max(1, len(sources)), figsize=(5.5 * max(1, len(sources)), 4), squeeze=False)
    for ax, src in zip(axes[0], sources):
        pos = sorted(last["retrieval_ece_served"][src], key=int)
        x = [int(p) for p in pos]
        ax.plot(x, [100 * last["retrieval_ece_served"][src][p] for p in pos], "o-", label="ECE, all served")
        ax.plot(x, [100 * last["retrieval_ece_served_floor"][src].get(p, float("nan")) for p in pos], "o--",
                label="its noise floor")
        win = last.get("retrieval_ece", {}).get(src, {})
        ax.plot([int(p) for p in sorted(win, key=int)], [100 * win[p] for p in sorted(win, key=int)], "x:",
                label="ECE, last 1024")
        ax.axhline(3, color="grey", lw=0.8)
        for xi, p in zip(x, pos):
            n = last.get("retrieval_predictions", {}).get(src, {}).get(p)
            if n is not None:
                ax.annotate(f"{int(n)}", (xi, 100 * last["retrieval_ece_served"][src][p]), fontsize=7,
                            textcoords="offset points", xytext=(0, 5), ha="center")
        ax.set_title(f"{src}: served ECE by draft position (labels: predictions)")
        ax.set_xlabel("draft position")
        ax.set_ylabel("ECE (%)")
        ax.legend(fontsize=8)
    fig.suptitle(f"Retrieval confidences on a served run, {data['date']}, {data['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=40.0, help="time budget for sending requests")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--chunk", type=int, default=6, help="requests between two readings")
    p.add_argument("--per-dataset", type=int, default=160, help="eval-mix prompts per dataset (at most)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--out", required=True, help="output stem: OUT.json, OUT.png")
    p.add_argument("server_args", nargs="*", help="extra launch_server flags (after --)")
    args = p.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    flags = ["--speculative-algorithm", "DSPARK_EXT", "--speculative-draft-model-path", str(DEFAULT_DRAFTER_DIR),
             "--enable-metrics", *args.server_args]
    prompts = eval_mix(args.per_dataset)
    data = {"date": time.strftime("%Y-%m-%d"), "machine": describe_machine(),
            "command": "python " + " ".join(sys.argv), "requests": 0, "tokens": 0}
    results = []
    deadline = time.time() + 60 * args.minutes
    with ServerProcess(flags) as srv:
        bar = tqdm(total=len(prompts), desc="served requests")
        t0 = time.time()
        for start in range(0, len(prompts), args.chunk):
            if time.time() > deadline:
                break
            chunk = prompts[start: start + args.chunk]
            res = run_load_sync(srv.base_url, chunk, args.concurrency, args.max_tokens, progress=False)
            results.extend(res.requests)
            bar.update(len(chunk))
            data.update(requests=len(results), tokens=sum(r.output_tokens for r in results),
                        wall_s=round(time.time() - t0, 1), by_source=by_source(results), reading=reading(srv.base_url))
            pred = data["reading"]["retrieval_predictions"].get("prompt", {}).get("1")
            bar.set_postfix(prompt_p1=pred)
            out.with_suffix(".json").write_text(json.dumps(data, indent=1))
        bar.close()
    plot(data, out.with_suffix(".png"))
    last = data["reading"]
    for src in sorted(last.get("retrieval_ece_served", {})):
        row = last["retrieval_ece_served"][src]
        print(src, " ".join(f"p{k}: {100 * row[k]:.1f}% (floor {100 * last['retrieval_ece_served_floor'][src][k]:.1f}, "
                            f"n {int(last['retrieval_predictions'][src][k])})" for k in sorted(row, key=int)))
    print(json.dumps(data["by_source"]))


if __name__ == "__main__":
    main()
