"""`python -m sglang_dspark.bench serve`: verify-length policies x concurrency x temperature on the real server.

One server per policy (or `--url` for a running one), closed-loop streaming OpenAI clients (bench/load.py), a fixed
output length (max_tokens + ignore_eos). Rows go to benchmarks/results/serve.json after every level, so an
interrupted run resumes where it stopped (rows already there for (policy, concurrency, temperature) are skipped
unless --force).

Where tau / verify lengths come from: the per-request `dspark` record when the server returns it on the stream;
otherwise, for DSPARK_EXT servers started here, the worker's step trace (SGLANG_DSPARK_TRACE_PATH): each level's
slice is cut out into traces/<policy>/c<C>_T<T>.jsonl, which is also the simulator's input (`bench sim`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import shlex
import sys
import time
from pathlib import Path

from tqdm import tqdm

from sglang_dspark.bench.machine import describe_machine
from sglang_dspark.bench.load import run_load_sync
from sglang_dspark.bench.report import RESULTS_DIR, markdown_table, shown_path, update_section
from sglang_dspark import profile_warmup
from sglang_dspark.bench.server import ServerProcess

DEFAULT_POLICIES = "none,ngram,fixed:1,fixed:3,fixed:5,fixed:7,sps-topk,dspark,dspark-async"
# No speculation: SGLang's default (overlap scheduler), and on the synchronous scheduler speculation gets on a CPU
PLAIN_POLICIES = ("none", "none-sync", "none-gemm-off", "none-gemm-64")
ROW_COLUMNS = ["policy", "concurrency", "temperature", "aggregate_tok_s", "per_user_tok_s_median",
               "per_user_tok_s_p10", "tau", "mean_verify_len", "wasted_verify_tokens"]
TRACE_ENV = "SGLANG_DSPARK_TRACE_PATH"
# Worker log lines (sglang_plugin/cost_profile.py) telling where its cost model came from.
COST_SOURCE_LINE = re.compile(r"DSPARK_EXT cost model: (\S+)")
COST_PROFILED_LINE = "DSPARK_EXT cost model profiled from"
# launch_server drives a start-up profiling load for about 60 s after /health (profile_warmup.py); measure after it:
# after its DONE_LINE where it logs one, else this long after /health.
LAUNCHER_PROFILE_LOAD_S = 65.0
# Settings that must match for old rows to be comparable with new ones (else: another --out, or --force).
RUN_SETTINGS = ("max_tokens", "model", "drafter", "prompts")


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help=f"comma list of none, none-sync (no overlap scheduler), none-gemm-off (SGLang's own GEMMs), "
                        f"none-gemm-64 (GEMM crossovers measured up to 64 rows only), "
                        f"ngram, fixed:G, threshold:C, sps-topk, dspark, dspark-async, dspark-noretrieval, "
                        f"retrieval-only, dspark-prompt, dspark-notable, dspark-table:PATH, dspark-gemm-off, "
                        f"dspark-nopeek (default: {DEFAULT_POLICIES})")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (ignore_eos)")
    p.add_argument("--requests-per-level", type=int, default=None,
                   help="requests per concurrency level (default: max(4, 2*c))")
    p.add_argument("--prompts", default=None,
                   help="JSONL with {\"turns\": [...]} (default: the eval gsm8k/humaneval/mt-bench mix)")
    p.add_argument("--model", default=None, help="target model dir (default: the launcher's embedded model)")
    p.add_argument("--drafter", default=None, help="DSpark drafter dir (default: the shipped drafter)")
    p.add_argument("--gamma", type=int, default=None, help="--dspark-gamma for DSpark policies")
    p.add_argument("--cost-model", default=None,
                   help="EngineCostModel JSON for every DSpark server (--dspark-cost-model-path); default: the "
                        "worker's cached profile, or it profiles at start (we wait for that before measuring)")
    p.add_argument("--profile-timeout", type=float, default=600.0,
                   help="max seconds to wait for a DSpark server's start-up cost profiling")
    p.add_argument("--ngram-args", default="--speculative-num-draft-tokens 8",
                   help="extra server flags for the ngram policy (see `python -m sglang_dspark.launch_server --help`)")
    p.add_argument("--server-args", default="", help="extra flags for every launched server")
    p.add_argument("--url", default=None,
                   help="benchmark a running server instead (then --policies names that server's one policy)")
    p.add_argument("--trace-file", default=None,
                   help="with --url: the SGLANG_DSPARK_TRACE_PATH file that server appends to (for tau etc.)")
    p.add_argument("--no-trace", action="store_true", help="do not record worker step traces")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--out", default=str(RESULTS_DIR / "serve.json"))
    p.add_argument("--force", action="store_true", help="re-measure rows already in --out")
    p.add_argument("--no-markdown", action="store_true", help="do not update BENCHMARKS.md")
    p.add_argument("--no-plots", action="store_true")


# ------------------------------------------------------------------------------------------------ helpers
def parse_policies(text: str) -> list[str]:
    policies = [p.strip() for p in text.split(",") if p.strip()]
    if not policies:
        raise SystemExit("serve: --policies is empty")
    return policies


def level_key(policy: str, concurrency: int, temperature: float) -> tuple[str, int, float]:
    return policy, int(concurrency), round(float(temperature), 4)


def row_key(row: dict) -> tuple[str, int, float]:
    return level_key(row["policy"], row["concurrency"], row["temperature"])


def load_results(path: Path) -> tuple[dict, list[dict]]:
    """(meta, rows) of an earlier run; accepts a bare list of rows too."""
    if not path.exists():
        return {}, []
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return {}, data
    return data.get("meta", {}), list(data.get("rows", []))


def save_results(path: Path, meta: dict, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    order = {}
    rows = sorted(rows, key=lambda r: (order.setdefault(r["policy"], len(order)), r["temperature"], r["concurrency"]))
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    tmp.replace(path)  # never leave a half-written file behind on Ctrl-C


def requests_for(concurrency: int, requests_per_level: int | None) -> int:
    return max(4, 2 * concurrency) if requests_per_level is None else requests_per_level


def load_prompt_list(path: str | None, needed: int) -> list[tuple]:
    """(dataset, prompt) pairs, or (dataset, prompt, extra request fields) for rows that carry some."""
    from sglang_dspark.bench.prompts import eval_mix, load_requests

    if path:
        prompts = [(Path(path).stem, p, extra) if extra else (Path(path).stem, p) for p, extra in load_requests(path)]
    else:
        prompts = eval_mix((needed + 2) // 3)
    if not prompts:
        raise SystemExit("serve: no prompts")
    return [prompts[i % len(prompts)] for i in range(needed)]  # cycle a short file


# DSPARK_EXT with one part switched, for A/Bs of the parts: policy name -> (controller, extra server flags)
POLICY_VARIANTS = {
    "dspark-noretrieval": ("dspark", ["--dspark-retrieval", "off"]),  # the drafter alone
    "retrieval-only": ("dspark", ["--dspark-no-model-drafts"]),  # retrieval drafts alone, no drafter pass
    "dspark-prompt": ("dspark", ["--dspark-retrieval", "prompt"]),  # drafter + prompt/output lookup, no corpus
    "dspark-notable": ("dspark", ["--dspark-ngram-table", "off"]),  # the default without the n-gram table
    "dspark-gemm-off": ("dspark", ["--dspark-cpu-gemm", "off"]),  # SGLang's own GEMMs, no small-M kernel
    "dspark-nopeek": ("dspark", ["--dspark-no-streak-peek"]),  # plain streaks skip the retrieval lookups too
}


TABLE_POLICY = "dspark-table:"  # dspark-table:PATH, the default with that n-gram table: A/Bs of two tables


def is_dspark_policy(policy: str) -> bool:
    return policy not in PLAIN_POLICIES + ("ngram",)


def server_flags(policy: str, args: argparse.Namespace) -> list[str]:
    """launch_server flags for one policy (plus --model-path and --server-args)."""
    common = (["--model-path", args.model] if args.model else []) + shlex.split(args.server_args)
    if policy == "none":
        return ["--no-dspark", *common]
    if policy == "none-sync":  # SGLang without speculation on the scheduler every speculative server runs on
        return ["--no-dspark", "--disable-overlap-schedule", *common]
    if policy == "none-gemm-off":  # SGLang's own GEMMs: what the small-M kernels are measured against
        return ["--no-dspark", "--dspark-cpu-gemm", "off", *common]
    if policy == "none-gemm-64":  # crossovers measured up to 64 rows: prefill widths stay on the small-M kernel
        return ["--no-dspark", "--dspark-cpu-gemm-rows", "64", *common]
    if policy == "ngram":
        # not --no-dspark: the launcher refuses it together with --speculative-algorithm. An explicit algorithm
        # already stops it from adding DSPARK_EXT. intel_amx: NGRAM's tree verify needs it (the CPU patch keeps it).
        return ["--speculative-algorithm", "NGRAM", "--attention-backend", "intel_amx",
                *shlex.split(args.ngram_args), *common]
    from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR

    drafter = args.drafter or str(DEFAULT_DRAFTER_DIR)
    if not (Path(drafter) / "config.json").exists():
        raise SystemExit(f"serve: policy {policy!r} needs a DSpark drafter; {drafter} has no config.json "
                         f"(train one or pass --drafter)")
    controller, variant = POLICY_VARIANTS.get(policy, (policy, []))
    if policy.startswith(TABLE_POLICY):  # the default serving another n-gram table file
        controller, variant = "dspark", ["--dspark-ngram-table", policy[len(TABLE_POLICY):]]
    flags = ["--speculative-algorithm", "DSPARK_EXT", "--speculative-draft-model-path", drafter,
             "--dspark-controller", controller, *variant]
    if args.gamma is not None:
        flags += ["--dspark-gamma", str(args.gamma)]
    if args.cost_model:
        flags += ["--dspark-cost-model-path", args.cost_model]
    return flags + common


def wait_for_cost_model(log_path: Path | None, healthy_at: float, drive, timeout_s: float,
                        profiling_allowed: bool = True, poll_s: float = 2.0) -> str:
    """Block until the DSPARK_EXT worker's cost model is final; returns where it came from.

    Without a cached/explicit model the worker verifies RANDOM lengths for its first decode steps (profiling) and
    the launcher sends its own load meanwhile: measuring then would time neither the policy nor our load alone.
    `drive()` sends a little traffic when the launcher's load ended before profiling did."""
    deadline = healthy_at + timeout_s
    while True:
        text = log_path.read_text(errors="replace") if log_path is not None and log_path.exists() else ""
        match = COST_SOURCE_LINE.search(text)
        if match is None:
            return "unknown"  # a worker that does not log its cost model: nothing to wait for
        if match.group(1) != "prior":
            return match.group(1)  # loaded from a file or the per-stack cache: no profiling phase
        if not profiling_allowed:
            return "prior"
        if COST_PROFILED_LINE in text:
            if profile_warmup.STARTED_LINE in text:  # its last level may run past the budget: wait for the end
                while profile_warmup.DONE_LINE not in text and time.time() < deadline:
                    time.sleep(poll_s)
                    text = log_path.read_text(errors="replace")
            else:
                time.sleep(max(0.0, healthy_at + LAUNCHER_PROFILE_LOAD_S - time.time()))
            return "profiled"
        if time.time() > deadline:
            tqdm.write(f"serve: warning: cost profiling unfinished after {timeout_s:.0f}s; measuring anyway")
            return "prior (profiling unfinished)"
        if time.time() > healthy_at + LAUNCHER_PROFILE_LOAD_S:
            drive()
        else:
            time.sleep(poll_s)


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


# ------------------------------------------------------------------------------------------------ trace stats
class TraceTail:
    """Reads what the worker appended to its step trace since the last call."""

    def __init__(self, path: Path | None):
        self.path = path
        self.offset = self._size()

    def _size(self) -> int:
        return self.path.stat().st_size if self.path is not None and self.path.exists() else 0

    def skip(self) -> None:
        self.offset = self._size()

    def take(self) -> list[str]:
        if self.path is None or not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        # only whole lines: a step being written right now stays for the next call
        end = data.rfind(b"\n") + 1
        self.offset += end
        return [ln for ln in data[:end].decode().splitlines() if ln.strip()]


def trace_stats(lines: list[str]) -> dict:
    """tau / mean verify length / wasted verify tokens over every (request, step) of the trace lines."""
    steps = verified = accepted = 0
    for line in lines:
        row = json.loads(line)
        steps += len(row["verify_lens"])
        verified += sum(row["verify_lens"])
        accepted += sum(row["accept_lens"])
    if steps == 0:
        return {}
    return {"tau": round((accepted + steps) / steps, 4), "mean_verify_len": round(verified / steps, 4),
            "wasted_verify_tokens": verified - accepted, "stats_source": "trace"}


# ------------------------------------------------------------------------------------------------ measuring
def measure_level(url: str, prompts: list[tuple[str, str]], policy: str, concurrency: int, temperature: float,
                  args: argparse.Namespace, tail: TraceTail | None, trace_dir: Path | None) -> dict:
    n = requests_for(concurrency, args.requests_per_level)
    if tail is not None:
        tail.skip()
    res = run_load_sync(url, prompts[:n], concurrency, args.max_tokens, temperature=temperature)
    row = {"policy": policy, "temperature": float(temperature), **res.summary(), "max_tokens": args.max_tokens}
    if "tau" in row:
        row["stats_source"] = "request"
    lines = tail.take() if tail is not None else []
    if lines:
        if "tau" not in row:
            row.update(trace_stats(lines))
        if trace_dir is not None:
            level_file = trace_dir / safe_name(policy) / f"c{concurrency}_T{temperature:g}.jsonl"
            level_file.parent.mkdir(parents=True, exist_ok=True)
            level_file.write_text("\n".join(lines) + "\n")
            row["trace"] = str(level_file)
    if policy in PLAIN_POLICIES:  # plain decoding: one token per target forward, nothing verified
        row.update(tau=1.0, mean_verify_len=0.0, wasted_verify_tokens=0, stats_source="none")
    for col in ROW_COLUMNS:
        row.setdefault(col, None)
    return row


def run(args: argparse.Namespace) -> list[dict]:
    policies = parse_policies(args.policies)
    if args.url and len(policies) != 1:
        raise SystemExit("serve: with --url, --policies must name the one policy that server runs")
    out = Path(args.out)
    trace_dir = None if args.no_trace else out.parent / "traces"
    settings = {"max_tokens": args.max_tokens, "model": args.model, "drafter": args.drafter, "prompts": args.prompts}
    meta, rows = load_results(out)
    if args.force:
        rows = [r for r in rows if row_key(r) not in
                {level_key(p, c, t) for p in policies for c in args.concurrency for t in args.temperatures}]
    elif rows:
        changed = {k: (meta.get(k), v) for k, v in settings.items() if k in meta and meta.get(k) != v}
        if changed:
            raise SystemExit(f"serve: {out} was measured with other settings (stored, now): {changed}; "
                             f"use another --out or --force")
    done = {row_key(r) for r in rows}
    todo = {p: [(c, t) for t in args.temperatures for c in args.concurrency if level_key(p, c, t) not in done]
            for p in policies}
    skipped = sum(len(args.concurrency) * len(args.temperatures) - len(v) for v in todo.values())
    if skipped:
        print(f"serve: {skipped} level(s) already in {out}; skipping them (--force to re-measure)", flush=True)

    meta = {**meta, **settings, "date": dt.date.today().isoformat(),
            "machine": describe_machine(),
            "command": "python -m sglang_dspark.bench serve " + shlex.join(_cli_argv()),
            "ignore_eos": True, "streaming": True}
    needed = max(requests_for(c, args.requests_per_level) for c in args.concurrency)
    prompts = load_prompt_list(args.prompts, needed) if any(todo.values()) else []
    bar = tqdm(total=sum(len(v) for v in todo.values()), desc="serve levels")
    try:
        for policy, levels in todo.items():
            if not levels:
                continue
            with _server(policy, args, trace_dir) as srv:
                bar.set_description(f"{policy}: warming up")
                cost_source = get_ready(srv, policy, args, prompts, [t for _, t in levels])
                tail = TraceTail(srv.trace_path) if srv.trace_path is not None else None
                for concurrency, temperature in levels:
                    bar.set_description(f"{policy} c={concurrency} T={temperature:g}")
                    row = measure_level(srv.url, prompts, policy, concurrency, temperature, args, tail, trace_dir)
                    if cost_source is not None:
                        row["cost_model"] = cost_source
                    rows.append(row)
                    save_results(out, meta, rows)
                    bar.update(1)
                    tqdm.write(_one_line(row))
    finally:
        bar.close()
    save_results(out, meta, rows)
    rows = load_results(out)[1]
    if not args.no_plots and rows:
        plot_frontier(rows, out.with_name(out.stem + "_frontier.png"))
        plot_verify_budget(rows, out.with_name(out.stem + "_verify_budget.png"))
    if not args.no_markdown and rows:
        update_section("serve", markdown_body(meta, rows, out))
    return rows


def get_ready(srv: "_server", policy: str, args: argparse.Namespace, prompts: list[tuple[str, str]],
              temperatures: list[float]) -> str | None:
    """Wait out the worker's start-up cost profiling, then warm the greedy and sampling paths before timing."""
    cost_source = None
    if is_dspark_policy(policy) and srv.proc is not None:
        cost_source = wait_for_cost_model(
            srv.proc.log_path, srv.healthy_at, lambda: run_load_sync(srv.url, prompts[:4], 4, 32, progress=False),
            args.profile_timeout, profiling_allowed="--dspark-no-profile" not in args.server_args)
    for temperature in dict.fromkeys(temperatures):
        run_load_sync(srv.url, prompts[:2], 2, 16, temperature=temperature, progress=False)
    return cost_source


class _server:
    """Context manager for the server one policy is measured on: launched here, or --url."""

    def __init__(self, policy: str, args: argparse.Namespace, trace_dir: Path | None):
        self.policy, self.args, self.trace_dir = policy, args, trace_dir
        self.proc: ServerProcess | None = None
        self.url = args.url.rstrip("/") if args.url else ""
        self.trace_path: Path | None = Path(args.trace_file) if args.url and args.trace_file else None
        self.healthy_at = 0.0

    def __enter__(self) -> "_server":
        if self.args.url:
            return self
        env = {}
        if self.trace_dir is not None and is_dspark_policy(self.policy):
            self.trace_dir.mkdir(parents=True, exist_ok=True)
            self.trace_path = self.trace_dir / f".live_{safe_name(self.policy)}.jsonl"
            self.trace_path.unlink(missing_ok=True)
            env[TRACE_ENV] = str(self.trace_path)
        tqdm.write(f"serve: starting server for {self.policy}")
        self.proc = ServerProcess(server_flags(self.policy, self.args), env=env,
                                  startup_timeout_s=self.args.startup_timeout)
        self.proc.start()
        self.healthy_at = time.time()
        self.url = self.proc.base_url
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.stop()
            if self.trace_path is not None:
                self.trace_path.unlink(missing_ok=True)  # the per-level slices are kept


def _cli_argv() -> list[str]:
    argv = sys.argv[1:]
    return argv[1:] if argv[:1] == ["serve"] else argv


def _one_line(row: dict) -> str:
    return ", ".join(f"{c}={row.get(c)}" for c in ROW_COLUMNS)


# ------------------------------------------------------------------------------------------------ reporting
def markdown_body(meta: dict, rows: list[dict], out: Path) -> str:
    shown = shown_path(out)
    body = (f"Command: `{meta.get('command')}` ({meta.get('date')}, {meta.get('machine')}; "
            f"{meta.get('max_tokens')} output tokens, ignore_eos, streaming). JSON: `{shown}`. "
            f"tau = tokens per target forward per request; mean_verify_len = drafts verified per request-step; "
            f"wasted = verified but rejected drafts (level total).\n\n")
    body += markdown_table(rows, ROW_COLUMNS)
    gains = matched_aggregate_gain(rows, "dspark", "fixed:1")
    if gains:
        body += ("\n\nPer-user speed of dspark vs fixed:1 at the same aggregate throughput (T=0; dspark's frontier "
                 "interpolated at each fixed:1 point):\n\n" + markdown_table(gains, list(gains[0])))
    return body


def matched_aggregate_gain(rows: list[dict], policy: str, baseline: str, temperature: float = 0.0) -> list[dict]:
    """Per-user speed of `policy` vs `baseline` at the same aggregate throughput: for every baseline point, the
    policy's per-user median interpolated (linearly in aggregate tok/s) along its own frontier. Points outside
    the policy's measured aggregate range are left out (no extrapolation)."""
    def curve(name):
        pts = sorted((r["aggregate_tok_s"], r["per_user_tok_s_median"]) for r in rows
                     if r["policy"] == name and abs(r["temperature"] - temperature) < 1e-6
                     and r.get("aggregate_tok_s") and r.get("per_user_tok_s_median"))
        return pts

    ours, base = curve(policy), curve(baseline)
    out = []
    for agg, user in base:
        for (a0, u0), (a1, u1) in zip(ours, ours[1:]):
            if a0 <= agg <= a1:
                mine = u0 + (u1 - u0) * (agg - a0) / (a1 - a0) if a1 > a0 else max(u0, u1)
                out.append({"aggregate_tok_s": agg, f"{baseline}_per_user": user, f"{policy}_per_user": round(mine, 3),
                            "gain": round(mine / user - 1.0, 3)})
                break
    return out


def _series(rows: list[dict]):
    """{temperature: {policy: rows sorted by concurrency}}"""
    out: dict[float, dict[str, list[dict]]] = {}
    for r in rows:
        out.setdefault(r["temperature"], {}).setdefault(r["policy"], []).append(r)
    for per_policy in out.values():
        for lst in per_policy.values():
            lst.sort(key=lambda r: r["concurrency"])
    return dict(sorted(out.items()))


def _figure(ncols: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(5.5 * ncols, 4.2), squeeze=False)
    return plt, fig, axes[0]


def plot_frontier(rows: list[dict], path: Path) -> Path:
    """Aggregate throughput vs median per-user speed, one curve per policy (points = concurrency levels)."""
    series = _series(rows)
    plt, fig, axes = _figure(len(series))
    for ax, (temp, per_policy) in zip(axes, series.items()):
        for policy, lst in per_policy.items():
            xs, ys = [r["per_user_tok_s_median"] for r in lst], [r["aggregate_tok_s"] for r in lst]
            ax.plot(xs, ys, "o-", label=policy)
            for r in lst:
                ax.annotate(str(r["concurrency"]), (r["per_user_tok_s_median"], r["aggregate_tok_s"]),
                            fontsize=6, textcoords="offset points", xytext=(3, 3))
        ax.set_xlabel("per-user tok/s (median)")
        ax.set_ylabel("aggregate tok/s")
        ax.set_title(f"throughput frontier, T={temp:g} (labels: concurrency)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_verify_budget(rows: list[dict], path: Path) -> Path:
    """Mean verified drafts per request-step vs concurrency (how the verify budget shrinks under load)."""
    series = _series(rows)
    plt, fig, axes = _figure(len(series))
    for ax, (temp, per_policy) in zip(axes, series.items()):
        for policy, lst in per_policy.items():
            pts = [(r["concurrency"], r["mean_verify_len"]) for r in lst if r.get("mean_verify_len") is not None]
            if pts:
                ax.plot(*zip(*pts), "o-", label=policy)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel("mean verify length (drafts / request-step)")
        ax.set_title(f"verify budget, T={temp:g}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
