"""`python -m sglang_dspark.bench ab`: paired, interleaved A/B of serving policies on the real server.

Why not `bench serve` + `bench repeats`: one server at a time, so whatever else slows this 2-core box for a minute
(measured: `none` at c = 1 gave 5.8, 7.7 and 8.4 tok/s in three runs of the same hour) lands on one policy's row
and not the other's, and three repeats resolve only differences above ~15%. Here every policy's server runs at
once (idle ones sleep: --sleep-on-idle), and each round sends the same short burst (same prompts, same
concurrency) to every server back to back, in a rotating order; no two rounds (nor the warm-up) share a prompt, so
no server replays an output it remembers. A slow minute then hits both sides of a pair, and
the per-round ratio cancels it. Reported per policy: the geometric mean of its per-round aggregate tok/s ratio to
the reference policy, with a 95% t-interval over rounds.

Rounds are appended to --out as they finish; a rerun with the same settings resumes where it stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import shlex
import sys
import time
from pathlib import Path

from tqdm import tqdm

from sglang_dspark.bench.machine import describe_machine
from sglang_dspark.bench.load import run_load_sync
from sglang_dspark.bench.report import RESULTS_DIR, markdown_table
from sglang_dspark.bench.serve import (_server, get_ready, is_dspark_policy, load_prompt_list, parse_policies,
                                       safe_name)

SETTINGS = ("policies", "max_tokens", "model", "drafter", "prompts", "server_args", "requests_per_round")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default="none,dspark",
                   help="comma list as for `bench serve`; the first is the reference the others are divided by")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--rounds", type=int, default=8, help="paired rounds per (concurrency, temperature)")
    p.add_argument("--requests-per-round", type=int, default=None,
                   help="requests per policy per round (default: max(2, c): one wave of the closed loop)")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (ignore_eos)")
    p.add_argument("--prompts", default=None, help="JSONL with {\"turns\": [...]} (default: the eval mix)")
    p.add_argument("--model", default=None)
    p.add_argument("--drafter", default=None)
    p.add_argument("--gamma", type=int, default=None)
    p.add_argument("--cost-model", default=None)
    p.add_argument("--profile-timeout", type=float, default=600.0)
    p.add_argument("--ngram-args", default="--speculative-num-draft-tokens 8")
    p.add_argument("--server-args", default="", help="extra flags for every launched server")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=str(RESULTS_DIR / "ab.json"))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-trace", action="store_true",
                   help="do not keep the DSPARK_EXT servers' step traces (default: <out stem>_traces/<policy>.jsonl; "
                        "each round records when each policy ran, to cut them per round)")


def per_round(concurrency: int, requests_per_round: int | None) -> int:
    return max(2, concurrency) if requests_per_round is None else requests_per_round


WARM_PROMPTS = 4  # warm-up / cost-profiling requests, on prompts no round measures


def prompt_plan(temperatures, concurrency_levels, rounds: int, requests_per_round: int | None) -> tuple[dict, range, int]:
    """({(temperature, concurrency, round): index range into the prompt list}, warm-up index range, prompts needed).
    Every round and the warm-up get prompts of their own: a server keeps what it generated (its prefix cache, the
    DSPARK_EXT output corpus, NGRAM's trie), so a prompt seen before would be replayed from memory at T = 0 and
    flatter the servers that remember over `none`."""
    plan, start = {}, 0
    for t in temperatures:
        for c in concurrency_levels:
            n = per_round(c, requests_per_round)
            for k in range(rounds):
                plan[(t, c, k)] = range(start, start + n)
                start += n
    return plan, range(start, start + WARM_PROMPTS), start + WARM_PROMPTS


def paired_ratio(values: list[float], reference: list[float]) -> dict:
    """Geometric mean ratio of paired positive samples with a 95% t-interval on the log ratios."""
    logs = [math.log(a / b) for a, b in zip(values, reference) if a > 0 and b > 0]
    n = len(logs)
    if n == 0:
        return {"rounds": 0, "ratio": None, "lo95": None, "hi95": None}
    mean = sum(logs) / n
    if n < 2:
        return {"rounds": 1, "ratio": math.exp(mean), "lo95": None, "hi95": None}
    from scipy.stats import t

    se = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1) / n)
    half = float(t.ppf(0.975, n - 1)) * se
    return {"rounds": n, "ratio": math.exp(mean), "lo95": math.exp(mean - half), "hi95": math.exp(mean + half)}


def summarize(rounds: list[dict], policies: list[str]) -> list[dict]:
    reference = policies[0]
    levels = sorted({(r["temperature"], r["concurrency"]) for r in rounds})
    rows = []
    for temperature, concurrency in levels:
        done = [r for r in rounds if (r["temperature"], r["concurrency"]) == (temperature, concurrency)
                and all(p in r["tok_s"] for p in policies)]
        ref = [r["tok_s"][reference] for r in done]
        for policy in policies[1:]:
            vals = [r["tok_s"][policy] for r in done]
            stats = paired_ratio(vals, ref)
            rows.append({"policy": policy, "reference": reference, "temperature": temperature,
                         "concurrency": concurrency, **stats,
                         "tok_s_mean": sum(vals) / len(vals) if vals else None,
                         "reference_tok_s_mean": sum(ref) / len(ref) if ref else None})
    return rows


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def run(args: argparse.Namespace) -> list[dict]:
    policies = parse_policies(args.policies)
    if len(policies) < 2:
        raise SystemExit("ab: --policies needs a reference and at least one other policy")
    out = Path(args.out)
    settings = {k: getattr(args, k) for k in SETTINGS}
    data = _load(out)
    if data and data.get("settings") != settings:
        raise SystemExit(f"ab: {out} holds rounds measured with other settings ({data.get('settings')}); "
                         f"use another --out")
    rounds: list[dict] = data.get("rounds", [])
    done = {(r["temperature"], r["concurrency"], r["round"]) for r in rounds}
    todo = [(t, c, k) for t in args.temperatures for c in args.concurrency for k in range(args.rounds)
            if (t, c, k) not in done]
    meta = {"date": dt.date.today().isoformat(), "machine": describe_machine(),
            "command": "python -m sglang_dspark.bench ab " + shlex.join(_cli_argv())}
    if todo:
        plan, warm_range, needed = prompt_plan(args.temperatures, args.concurrency, args.rounds,
                                               args.requests_per_round)
        prompts = load_prompt_list(args.prompts, needed)
        unique = len({p[1] for p in prompts})
        if unique < needed:
            print(f"ab: only {unique} distinct prompts for {needed} requests: some rounds repeat a prompt an earlier "
                  f"round or the warm-up sent (servers that remember outputs gain from it)", file=sys.stderr)
        meta["prompt_repeats"] = needed - unique
        warm = [prompts[i] for i in warm_range]
        args.url, args.trace_file = None, None  # _server / get_ready read these (bench serve's options)
        if "--sleep-on-idle" not in args.server_args:
            args.server_args = (args.server_args + " --sleep-on-idle").strip()
        trace_dir = None if args.no_trace else out.with_name(out.stem + "_traces")
        with contextlib.ExitStack() as stack:
            servers = {}
            for policy in policies:
                srv = stack.enter_context(_server(policy, args, trace_dir))
                if srv.trace_path is not None:  # keep the whole trace: _server deletes its live file on exit
                    stack.callback(_keep_trace, srv.trace_path, trace_dir / f"{safe_name(policy)}.jsonl")
                get_ready(srv, policy, args, warm, args.temperatures)
                servers[policy] = srv
            bar = tqdm(total=len(todo), desc="ab rounds")
            for temperature, concurrency, k in todo:
                batch = [prompts[i] for i in plan[(temperature, concurrency, k)]]
                order = policies[k % len(policies):] + policies[:k % len(policies)]
                tok_s, span, tau, by_source, ttft, decode = {}, {}, {}, {}, {}, {}
                for policy in order:
                    t0 = time.time()
                    res = run_load_sync(servers[policy].url, batch, concurrency, args.max_tokens,
                                        temperature=temperature, progress=False)
                    summary = res.summary()
                    tok_s[policy] = summary["aggregate_tok_s"]
                    # prefill and decode apart: a server can lose on either (its prefill writes drafter context)
                    ttft[policy], decode[policy] = summary["ttft_s_median"], summary["per_user_tok_s_median"]
                    if summary.get("tau") is not None:
                        tau[policy] = summary["tau"]
                    if summary.get("by_source"):
                        by_source[policy] = summary["by_source"]
                    span[policy] = [round(t0, 3), round(time.time(), 3)]
                rounds.append({"temperature": temperature, "concurrency": concurrency, "round": k,
                               "order": order, "tok_s": tok_s, "span": span, "tau": tau,
                               "ttft_s_median": ttft, "decode_tok_s_median": decode,
                               **({"by_source": by_source} if by_source else {})})
                _save(out, {"settings": settings, "meta": meta, "rounds": rounds,
                            "rows": summarize(rounds, policies)})
                bar.set_description(f"ab c={concurrency} T={temperature:g}")
                bar.update(1)
            bar.close()
            for metric in ("retrieval_ece", "retrieval_ece_floor"):
                got = {policy: scrape_retrieval_ece(srv.url, metric) for policy, srv in servers.items()
                       if is_dspark_policy(policy)}
                data[metric] = {p: e for p, e in got.items() if e} or data.get(metric)
            got = {policy: scrape_step_counts(srv.url) for policy, srv in servers.items() if is_dspark_policy(policy)}
            data["step_counts"] = {p: c for p, c in got.items() if c} or data.get("step_counts")
    rows = summarize(rounds, policies)
    _save(out, {"settings": settings, "meta": {**data.get("meta", {}), **meta}, "rounds": rounds, "rows": rows,
                "sources": source_summary(rounds),
                **{k: data[k] for k in ("retrieval_ece", "retrieval_ece_floor", "step_counts") if data.get(k)}})
    print(markdown_table(rows, ["policy", "reference", "temperature", "concurrency", "rounds", "ratio", "lo95",
                                "hi95", "tok_s_mean", "reference_tok_s_mean"]))
    if not args.no_plots and rows:
        plot(rows, out.with_suffix(".png"))
    return rows


def source_summary(rounds: list[dict]) -> list[dict]:
    """Per (policy, concurrency, temperature, source): steps, share of the policy's request-steps, and tau of the
    steps that source drafted (1 + accepted / steps), pooled over rounds."""
    pooled: dict[tuple, dict[str, dict[str, int]]] = {}
    for r in rounds:
        for policy, sources in r.get("by_source", {}).items():
            cell = pooled.setdefault((policy, r["concurrency"], r["temperature"]), {})
            for source, counts in sources.items():
                agg = cell.setdefault(source, {"steps": 0, "verified": 0, "accepted": 0})
                for k in agg:
                    agg[k] += counts[k]
    out = []
    for (policy, c, t), cell in pooled.items():
        total = sum(v["steps"] for v in cell.values())
        for source, v in cell.items():
            out.append({"policy": policy, "concurrency": c, "temperature": t, "source": source, **v,
                        "step_share": round(v["steps"] / total, 4) if total else None,
                        "tau": round(1 + v["accepted"] / v["steps"], 4) if v["steps"] else None})
    return out


def _metrics_text(url: str) -> str:
    """A server's Prometheus exposition text; empty when it does not answer (metrics off, server gone)."""
    import urllib.request

    try:
        return urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    except Exception:
        return ""


def scrape_retrieval_ece(url: str, metric: str = "retrieval_ece") -> dict[str, dict[str, float]]:
    """{source: {position: ECE}} from a server's /metrics (empty when it exports none, e.g. metrics off);
    metric="retrieval_ece_floor": the same windows' noise floor."""
    import re

    text = _metrics_text(url)
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line.startswith(f"sglang:dspark_{metric}{{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        out.setdefault(labels.get("source", "?"), {})[labels.get("position", "?")] = float(line.rsplit(" ", 1)[1])
    return out


STEP_COUNTERS = ("batch_steps", "plain_decode_steps", "unplanned_steps", "peek_steps")


def scrape_step_counts(url: str) -> dict[str, float]:
    """A server's decode batch steps since it started (warm-up included): all of them, those that ran as plain
    decoding, and those of them taken without building a plan (the plain streak). Empty when metrics are off."""
    text = _metrics_text(url)
    out: dict[str, float] = {}
    for line in text.splitlines():
        for name in STEP_COUNTERS:
            if line.startswith(f"sglang:dspark_{name}_total"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _keep_trace(live: Path, keep: Path) -> None:
    if live.exists():
        keep.parent.mkdir(parents=True, exist_ok=True)
        with open(keep, "ab") as dst:  # a resumed run appends
            dst.write(live.read_bytes())


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in rows})
    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
    for ax, temperature in zip(axes[0], temps):
        for i, policy in enumerate(sorted({r["policy"] for r in rows})):
            pts = sorted((r["concurrency"], r["ratio"], r["lo95"], r["hi95"]) for r in rows
                         if r["policy"] == policy and r["temperature"] == temperature and r["ratio"])
            if not pts:
                continue
            xs = [p[0] * (1 + 0.04 * i) for p in pts]
            ys = [p[1] for p in pts]
            err = [[p[1] - (p[2] or p[1]) for p in pts], [(p[3] or p[1]) - p[1] for p in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=policy)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.axhline(0.97, color="gray", lw=0.8, ls=":")
        # a 2-round interval can span orders of magnitude: keep the points readable, the bars run off the axes
        top = max([r["ratio"] for r in rows if r["temperature"] == temperature and r["ratio"]] or [1.0])
        ax.set_ylim(0, max(1.2, 1.4 * top))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(f"aggregate tok/s / {rows[0]['reference']}")
        ax.set_title(f"paired rounds, T = {temperature:g} (95% CI)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _cli_argv() -> list[str]:
    argv = sys.argv[1:]
    return argv[1:] if argv[:1] == ["ab"] else argv
