"""`python -m sglang_dspark.bench single_stream`: one request at a time, per dataset and temperature.

Issue 4's table: tok/s and tau for no speculation, SGLang NGRAM and DSPARK_EXT policies on gsm8k / humaneval /
mt-bench, T = 0 and T = 1. One server per policy (the serve benchmark's launcher, warm-up and trace reading);
each (dataset, temperature) cell runs `--requests` prompts of that dataset back to back (concurrency 1).
Writes benchmarks/results/single_stream.json (rows with policy, dataset, temperature, tok_s, tau, ...), the
"single_stream" section of BENCHMARKS.md with the speedup over `none` per cell, and a bar chart PNG.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from pathlib import Path

from tqdm import tqdm

from sglang_dspark.bench.prompts import load_prompts
from sglang_dspark.bench.report import RESULTS_DIR, markdown_table, shown_path, update_section
from sglang_dspark.bench.serve import TraceTail, _server, get_ready, measure_level, parse_policies

DATASETS = ("gsm8k", "humaneval", "mt-bench")
COLUMNS = ["policy", "dataset", "temperature", "tok_s", "speedup_vs_none", "tau", "mean_verify_len"]


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default="none,ngram,fixed:7,threshold:0.5,dspark")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS))
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--requests", type=int, default=4, help="prompts per (dataset, temperature) cell")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--drafter", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--gamma", type=int, default=None)
    p.add_argument("--cost-model", default=None)
    p.add_argument("--profile-timeout", type=float, default=600.0)
    p.add_argument("--ngram-args", default="--speculative-num-draft-tokens 8")
    p.add_argument("--server-args", default="")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=str(RESULTS_DIR / "single_stream.json"))
    p.add_argument("--no-markdown", action="store_true")
    p.add_argument("--no-plots", action="store_true")


def _serve_namespace(args: argparse.Namespace) -> argparse.Namespace:
    """The fields bench serve's helpers read."""
    return argparse.Namespace(url=None, trace_file=None, requests_per_level=args.requests, max_tokens=args.max_tokens,
                              model=args.model, drafter=args.drafter, gamma=args.gamma, cost_model=args.cost_model,
                              profile_timeout=args.profile_timeout, ngram_args=args.ngram_args,
                              server_args=args.server_args, startup_timeout=args.startup_timeout)


def with_speedups(rows: list[dict]) -> list[dict]:
    base = {(r["dataset"], r["temperature"]): r["tok_s"] for r in rows if r["policy"] == "none"}
    for r in rows:
        ref = base.get((r["dataset"], r["temperature"]))
        r["speedup_vs_none"] = round(r["tok_s"] / ref, 3) if ref else None
    return rows


def run(args: argparse.Namespace) -> list[dict]:
    policies = parse_policies(args.policies)
    sargs = _serve_namespace(args)
    trace_dir = Path(args.out).parent / "traces_single_stream"
    prompts = {d: [(d, p) for p in load_prompts(f"eval/{d}.jsonl", args.requests)] for d in args.datasets}
    warm = [pair for d in args.datasets for pair in prompts[d][:2]]
    rows: list[dict] = []
    bar = tqdm(total=len(policies) * len(args.datasets) * len(args.temperatures), desc="single stream")
    for policy in policies:
        with _server(policy, sargs, trace_dir) as srv:
            get_ready(srv, policy, sargs, warm, list(args.temperatures))
            tail = TraceTail(srv.trace_path) if srv.trace_path is not None else None
            for temperature in args.temperatures:
                for dataset in args.datasets:
                    bar.set_description(f"{policy} {dataset} T={temperature:g}")
                    row = measure_level(srv.url, prompts[dataset], policy, 1, temperature, sargs, tail, None)
                    rows.append({"policy": policy, "dataset": dataset, "temperature": float(temperature),
                                 "tok_s": row["aggregate_tok_s"], "tau": row.get("tau"),
                                 "mean_verify_len": row.get("mean_verify_len"), "requests": args.requests,
                                 "max_tokens": args.max_tokens})
                    bar.update(1)
                    tqdm.write(json.dumps(rows[-1]))
    bar.close()
    rows = with_speedups(rows)
    meta = {"date": dt.date.today().isoformat(),
            "command": "python -m sglang_dspark.bench single_stream " + shlex.join(_cli_argv())}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    if not args.no_plots:
        plot(rows, out.with_suffix(".png"))
    if not args.no_markdown:
        update_section("single_stream", f"Command: `{meta['command']}` ({meta['date']}; concurrency 1, "
                       f"{args.requests} prompts per cell, {args.max_tokens} output tokens, ignore_eos). "
                       f"JSON: `{shown_path(out)}`.\n\n" + markdown_table(rows, COLUMNS))
    return rows


def _cli_argv() -> list[str]:
    argv = sys.argv[1:]
    return argv[1:] if argv[:1] == ["single_stream"] else argv


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(6 * len(temps), 4), squeeze=False)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    width = 0.8 / max(len(policies), 1)
    for ax, temp in zip(axes[0], temps):
        for i, policy in enumerate(policies):
            vals = [next((r["tok_s"] for r in rows if r["policy"] == policy and r["dataset"] == d
                          and r["temperature"] == temp), 0.0) for d in datasets]
            ax.bar([j + i * width for j in range(len(datasets))], vals, width, label=policy)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(datasets))], datasets)
        ax.set_ylabel("tok/s (single stream)")
        ax.set_title(f"T={temp:g}")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
