"""`python -m sglang_dspark.bench grammar_mix`: does one structured-output request slow its batch-mates down?

One DSPARK_EXT server (or --policy none). Each round sends two bursts of the same C requests, in alternating order:
  mixed : request 0 carries a JSON-schema response_format (a row of --json-prompts), the others are free prompts;
  free  : the same C requests with request 0's response_format removed.
Reported: the paired ratio (mixed / free, geometric mean over rounds, 95% t-interval) of the free requests' mean
per-user decode tok/s, i.e. what the batch-mates of one JSON client keep. A server that stops speculating for a
whole batch when one request has a grammar shows up here as a ratio below 1. Rounds are appended to --out as they
finish; a rerun with the same settings resumes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from pathlib import Path

from tqdm import tqdm

from sglang_dspark.bench.machine import describe_machine
from sglang_dspark.bench.ab import _load, _save, paired_ratio
from sglang_dspark.bench.load import run_load_sync
from sglang_dspark.bench.report import RESULTS_DIR
from sglang_dspark.bench.serve import _server, get_ready, load_prompt_list

SETTINGS = ("policy", "concurrency", "max_tokens", "json_prompts", "prompts", "server_args")
DEFAULT_JSON = Path(__file__).resolve().parents[2] / "benchmarks" / "workloads" / "json-extract.jsonl"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="dspark", help="as for `bench serve` (dspark, none, ...)")
    p.add_argument("--concurrency", type=int, default=4, help="requests per burst (one of them structured)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--json-prompts", default=str(DEFAULT_JSON), help="JSONL rows with a response_format")
    p.add_argument("--prompts", default=None, help="free prompts (default: the eval mix)")
    p.add_argument("--model", default=None)
    p.add_argument("--drafter", default=None)
    p.add_argument("--gamma", type=int, default=None)
    p.add_argument("--cost-model", default=None)
    p.add_argument("--profile-timeout", type=float, default=600.0)
    p.add_argument("--ngram-args", default="--speculative-num-draft-tokens 8")
    p.add_argument("--server-args", default="")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=str(RESULTS_DIR / "grammar_mix.json"))


def bursts(free: list[tuple], structured: list[tuple], k: int, c: int) -> tuple[list[tuple], list[tuple]]:
    """(mixed, free) bursts of round k: the same C prompts, the first one with / without its response_format."""
    row = structured[k % len(structured)]
    others = [free[(k * (c - 1) + i) % len(free)] for i in range(c - 1)]
    return [row, *others], [row[:2], *others]


def free_mate_tok_s(res) -> float:
    """Mean per-user decode tok/s of the requests after the first (the free batch-mates)."""
    mates = [r.decode_tok_s for r in sorted(res.requests, key=lambda r: r.index)[1:]]
    return sum(mates) / len(mates) if mates else 0.0


def run(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    settings = {k: getattr(args, k) for k in SETTINGS}
    data = _load(out)
    if data and data.get("settings") != settings:
        raise SystemExit(f"grammar_mix: {out} holds rounds measured with other settings; use another --out")
    rounds: list[dict] = data.get("rounds", [])
    todo = [k for k in range(args.rounds) if k not in {r["round"] for r in rounds}]
    meta = {"date": dt.date.today().isoformat(), "machine": describe_machine(),
            "command": "python -m sglang_dspark.bench grammar_mix " + shlex.join(sys.argv[2:])}
    if todo:
        from sglang_dspark.bench.prompts import load_requests

        structured = [(Path(args.json_prompts).stem, text, extra) for text, extra in load_requests(args.json_prompts)]
        if not structured or not all(extra for _, _, extra in structured):
            raise SystemExit(f"grammar_mix: {args.json_prompts} rows need a response_format")
        free = load_prompt_list(args.prompts, args.rounds * args.concurrency)
        args.url, args.trace_file = None, None
        with _server(args.policy, args, None) as srv:
            get_ready(srv, args.policy, args, free, [0.0])
            run_load_sync(srv.url, [structured[0]], 1, 32, progress=False)  # compile the grammar path once
            for k in tqdm(todo, desc="grammar_mix rounds"):
                mixed, plain = bursts(free, structured, k, args.concurrency)
                res = {}
                for name, burst in ((("mixed", mixed), ("free", plain)) if k % 2 == 0 else
                                    (("free", plain), ("mixed", mixed))):
                    r = run_load_sync(srv.url, burst, args.concurrency, args.max_tokens, temperature=0.0,
                                      progress=False)
                    res[name] = {"mates_tok_s": round(free_mate_tok_s(r), 3), **r.summary()}
                rounds.append({"round": k, **res})
                _save(out, {"settings": settings, "meta": meta, "rounds": rounds})
    summary = {metric: paired_ratio([r["mixed"][key] for r in rounds], [r["free"][key] for r in rounds])
               for metric, key in (("batch_mates_decode_tok_s", "mates_tok_s"),
                                   ("aggregate_tok_s", "aggregate_tok_s"))}
    _save(out, {"settings": settings, "meta": {**data.get("meta", {}), **meta}, "rounds": rounds,
                "summary": summary})
    print(json.dumps(summary, indent=2))
    plot(rounds, out.with_suffix(".png"), args.policy)
    return summary


def plot(rounds: list[dict], path: Path, policy: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [r["round"] for r in rounds]
    ax.plot(ks, [r["free"]["mates_tok_s"] for r in rounds], "o-", label="batch-mates, all free")
    ax.plot(ks, [r["mixed"]["mates_tok_s"] for r in rounds], "s-", label="batch-mates, one JSON-schema request")
    ax.set_xlabel("round")
    ax.set_ylabel("mean per-user decode tok/s")
    ax.set_title(f"{policy}: batch-mates of a structured-output request")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
