"""`python -m sglang_dspark.bench baseline`: the embedded model on real SGLang with no speculation."""

from __future__ import annotations

import argparse
import datetime as dt

from sglang_dspark.bench.machine import describe_machine
from sglang_dspark.bench.load import run_load_sync
from sglang_dspark.bench.prompts import eval_mix
from sglang_dspark.bench.report import markdown_table, update_section, write_json, RESULTS_DIR
from sglang_dspark.bench.server import ServerProcess


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--requests-per-level", type=int, default=None,
                   help="requests per concurrency level (default: max(4, 2*c))")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--url", default=None, help="use a running server instead of starting one")
    p.add_argument("--server-args", default="", help="extra flags for the launched server")
    p.add_argument("--out", default="baseline.json")
    p.add_argument("--no-markdown", action="store_true")


def run(args: argparse.Namespace) -> list[dict]:
    need = max(max(4, 2 * c) if args.requests_per_level is None else args.requests_per_level
               for c in args.concurrency)
    prompts = eval_mix((need + 2) // 3)
    rows = []

    def measure(url: str) -> None:
        run_load_sync(url, prompts[:2], 1, 8)  # warm the server's paths before timing
        for c in args.concurrency:
            n = max(4, 2 * c) if args.requests_per_level is None else args.requests_per_level
            res = run_load_sync(url, prompts[:n], c, args.max_tokens, temperature=0.0)
            row = {"policy": "none", "temperature": 0.0, **res.summary()}
            rows.append(row)
            print(row, flush=True)

    if args.url:
        measure(args.url)
    else:
        with ServerProcess(["--no-dspark", *args.server_args.split()]) as srv:
            measure(srv.base_url)

    meta = {"date": dt.date.today().isoformat(), "machine": describe_machine(),
            "max_tokens": args.max_tokens,
            "command": f"python -m sglang_dspark.bench baseline --max-tokens {args.max_tokens} "
                       f"--concurrency {' '.join(map(str, args.concurrency))}"}
    path = write_json(args.out, {"meta": meta, "rows": rows})
    _plot(rows, RESULTS_DIR / args.out.replace(".json", ".png"))
    if not args.no_markdown:
        single = next((r for r in rows if r["concurrency"] == 1), None)
        body = (f"Command: `{meta['command']}` ({meta['date']}, {meta['machine']}, "
                f"embedded Qwen2.5-Coder-0.5B-Instruct bf16, T=0, {args.max_tokens} output tokens, "
                f"eval prompts gsm8k/humaneval/mt-bench). JSON: `{path.relative_to(path.parents[2])}`.\n\n"
                + markdown_table(rows, ["concurrency", "num_requests", "aggregate_tok_s", "per_user_tok_s_median",
                                        "per_user_tok_s_p10", "ttft_s_median"]))
        if single:
            body += f"\n\nSingle stream: **{single['per_user_tok_s_median']:.1f} tok/s** decode."
        update_section("baseline", body)
    return rows


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 0


def _plot(rows: list[dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = [r["concurrency"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(cs, [r["aggregate_tok_s"] for r in rows], "o-", label="aggregate")
    ax.plot(cs, [r["per_user_tok_s_median"] for r in rows], "s--", label="per user (median)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s")
    ax.set_title("No speculation (baseline)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
