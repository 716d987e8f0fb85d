"""`python -m sglang_dspark.bench sim`: trace-replay simulator of verify-length policies at any concurrency.

Input: step traces the DSPARK_EXT worker writes (SGLANG_DSPARK_TRACE_PATH=<file>; `bench serve` keeps one file
per level under benchmarks/results/traces/). Each trace row is one decode step: per request the calibrated
confidences conf[G], the verify length l and the accepted length a, plus kv_lens, draft_s and verify_s.

Record the request pool with `fixed:<G>` (G = the drafter's gamma): then every draft is verified and a is the TRUE
acceptance length A. Rows with l < G and a == l are censored (A >= l, value unknown) and are left out of the pool
(this also drops requests the worker skipped drafting for, and most of its random-length cost-profiling steps);
traces of other policies still feed the cost fit. Why min(A, l) is exact: the accept decision for draft j depends
only on drafts 0..j and the target's randomness at position j - never on how many drafts after j are verified - so
verifying l drafts accepts exactly min(A, l) of them (greedy and rejection sampling alike, same random draws).

Per (policy, concurrency c): `--steps` synthetic batches of c request-rows drawn from the pool (the same batches for
every policy), l = policy.choose(conf, ctx), accepted = min(A, l). The step is modelled the way the worker runs it:
  * draft skipping (`--draft-skip probe`, the worker's default): each of the c batch slots keeps a streak of l = 0
    steps; a slot not due for a probe (control/draft_skip.py, including the batch-level probe gate) is not drafted
    for and its confidences are 0;
  * the plain-decode gate (dspark, dspark-async, sps-topk, as in the worker) may turn a verify plan into plain
    decoding; a step with l = 0 everywhere costs a plain decode step (fitted from the trace's plain steps, which
    the worker marks) instead of a verify step;
  * step time = verify (or plain) cost + draft time d0 + d1 * (requests drafted), fitted from the trace's draft_s,
    + overhead o0 + o1 * R: the wall-clock gap between consecutive traced steps minus their draft and forward time
    (scheduler work, streaming, and the prefills of requests joining), fitted from trace rows that carry "t".
goodput = sum(accepted + 1) / sum(step time).
The verify cost model is --cost-model (an EngineCostModel JSON; it predicts the verify forward only, like the
worker's) or is fitted from the traces' verify steps. `oracle` knows A (BatchContext.true_accept_lens), drafts only
what it verifies and pays the full step cost. Not modelled: prefill, scheduling overhead, requests joining/leaving -
so `--validate serve.json` (relative error vs the real server at c <= 16) shows the size of those effects.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import glob
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from sglang_dspark.bench.report import RESULTS_DIR, markdown_table, update_section
from sglang_dspark.control import BatchContext, EngineCostModel, PlainDecodeGate, StepOutcome, make_policy
from sglang_dspark.control.cost_model import nonnegative_lstsq
from sglang_dspark.control.draft_skip import BatchProbeGate
from sglang_dspark.control.draft_value import PRICED_DRAFTING_POLICIES, drafting_pays, step_prices
from sglang_dspark.control.plain_decode import is_gated

DEFAULT_POLICIES = "none,fixed:1,fixed:3,fixed:5,fixed:7,sps-topk,dspark,dspark-async,oracle"
DEFAULT_CONCURRENCY = [1, 2, 4, 8, 16, 32, 64, 128, 256]
ROW_COLUMNS = ["policy", "concurrency", "goodput_tok_s", "per_user_tok_s", "tau", "mean_verify_len",
               "wasted_per_step", "mean_step_ms"]
COST_FEATURE_SCALE = np.array([1.0, 256.0, 64.0, 65536.0])  # as control/cost_model.py: well-conditioned lstsq
SKIPPED_CONF_LOGIT = -30.0  # worker.py _draft: confidence logit of requests it did not draft for
NOT_SIMULATED = {"ngram"}  # no confidences in the trace for SGLang's own drafters
MAX_STEP_GAP_S = 2.0


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", nargs="+", required=True,
                   help="trace JSONL files, globs or folders (searched for *.jsonl); record with fixed:<gamma>")
    p.add_argument("--cost-model", default=None, help="EngineCostModel JSON (verify step time); default: fit")
    p.add_argument("--save-cost-model", default=None, help="write the fitted verify cost model here")
    p.add_argument("--policies", default=DEFAULT_POLICIES)
    p.add_argument("--concurrency", type=int, nargs="+", default=DEFAULT_CONCURRENCY)
    p.add_argument("--steps", type=int, default=200, help="simulated steps per (policy, concurrency)")
    p.add_argument("--gamma", type=int, default=None, help="draft width (default: the traces' conf width)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft-skip", default="probe", choices=["probe", "off", "free"],
                   help="probe: the worker's draft skipping (default); off: draft every request every step; "
                        "free: a request with l = 0 costs no draft time (optimistic bound)")
    p.add_argument("--no-overhead", action="store_true",
                   help="leave the per-step time outside draft + forward (from trace timestamps) out")
    p.add_argument("--no-plain-steps", action="store_true",
                   help="cost l = 0 steps as verify steps (no plain-decode fast path, no gate)")
    p.add_argument("--no-draft-cost", action="store_true", help="leave draft time out of the step time")
    p.add_argument("--validate", default=None, metavar="SERVE_JSON",
                   help="compare with real server rows (bench serve output) at c <= --validate-max-concurrency")
    p.add_argument("--validate-max-concurrency", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0,
                   help="temperature the traces were recorded at (which serve rows --validate compares with)")
    p.add_argument("--out", default=str(RESULTS_DIR / "sim.json"))
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-markdown", action="store_true")


# ------------------------------------------------------------------------------------------------ trace input
@dataclass
class TraceData:
    conf: torch.Tensor  # Float[N, G] calibrated per-position acceptance probabilities
    true_accept: torch.Tensor  # Long[N] acceptance length with all G drafts verified
    kv_lens: torch.Tensor  # Long[N]
    cost_samples: list[tuple[int, int, int, float]]  # (T, R, K, verify_s) per verify step
    draft_samples: list[tuple[int, float]]  # (R, draft_s) per step
    num_censored: int
    plain_samples: list[tuple[int, int, float]] = None  # (R, K, seconds) per plain-decode step
    overhead_samples: list[tuple[int, float]] = None  # (R, seconds outside draft + forward) per step

    @property
    def gamma(self) -> int:
        return self.conf.shape[1]


def expand_paths(items: list[str]) -> list[Path]:
    paths: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            paths += sorted(q for q in p.rglob("*.jsonl") if not q.name.startswith("."))
        elif any(ch in item for ch in "*?["):
            paths += sorted(Path(q) for q in glob.glob(item, recursive=True))
        else:
            paths.append(p)
    if not paths:
        raise SystemExit(f"sim: no trace files in {items}")
    return paths


def num_drafted(step: dict) -> int:
    """Requests the worker drafted for in this step (draft skipping leaves some out)."""
    if "drafted" in step:
        drafted = step["drafted"]
        return int(sum(drafted)) if isinstance(drafted, list) else int(drafted)
    logits = step.get("conf_logits")
    if logits is None:
        return len(step["verify_lens"])
    # a skipped request gets the worker's sentinel confidence logit at every position
    return sum(1 for row in logits if any(x != SKIPPED_CONF_LOGIT for x in row))


def load_traces(paths: list[Path]) -> TraceData:
    confs, accepts, kvs, costs, drafts, plains, overheads = [], [], [], [], [], [], []
    gamma, censored = None, 0
    for path in paths:
        last_t = None
        with open(path) as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                step = json.loads(line)
                if "t" in step:
                    if last_t is not None:
                        gap = float(step["t"]) - last_t - float(step.get("draft_s", 0.0)) - float(step["verify_s"])
                        if 0.0 <= gap < MAX_STEP_GAP_S:  # a longer gap is idle time between benchmark levels
                            overheads.append((len(step["verify_lens"]), gap))
                    last_t = float(step["t"])
                verify, accept, kv, conf = step["verify_lens"], step["accept_lens"], step["kv_lens"], step["conf"]
                if not verify:
                    continue
                width = len(conf[0])
                if gamma is None:
                    gamma = width
                elif width != gamma:
                    raise SystemExit(f"sim: {path}:{line_no}: conf width {width}, earlier traces had {gamma}")
                if step.get("plain"):
                    plains.append((len(verify), sum(kv), float(step["verify_s"])))
                else:
                    costs.append((len(verify) + sum(verify), len(verify), sum(kv), float(step["verify_s"])))
                drafts.append((num_drafted(step), float(step.get("draft_s", 0.0))))
                for r, (v, a) in enumerate(zip(verify, accept)):
                    if v < width and a >= v:
                        censored += 1  # everything verified was accepted: the true length is unknown
                        continue
                    confs.append(conf[r])
                    accepts.append(a)
                    kvs.append(kv[r])
    if not confs:
        raise SystemExit(f"sim: no uncensored request-rows in {len(paths)} trace file(s); record with fixed:<gamma>")
    return TraceData(torch.tensor(confs, dtype=torch.float32), torch.tensor(accepts, dtype=torch.long),
                     torch.tensor(kvs, dtype=torch.long), costs, drafts, censored, plains, overheads)


# ------------------------------------------------------------------------------------------------ cost models
def fit_cost_model(samples: list[tuple[int, int, int, float]]) -> EngineCostModel:
    """Verify-step cost from trace steps: the robust fit, or a non-negative one where that goes negative (a
    negative KV or request term extrapolates to zero step time at high concurrency). Traces of one fixed:G alone
    have T = (G+1)*R and cannot separate the per-token from the per-request cost: the non-negative fit then keeps
    one of them - record several fixed:G values (or pass --cost-model) to tell them apart."""
    arr = np.asarray(samples, dtype=float)
    if len(arr) < 4:
        raise SystemExit(f"sim: {len(arr)} trace steps are too few to fit a cost model; pass --cost-model")
    T, R, K, y = arr.T
    X = np.stack([np.ones_like(T), T, R, K], axis=1) / COST_FEATURE_SCALE
    if np.linalg.matrix_rank(X) == 4:
        model = EngineCostModel().fit([tuple(s) for s in samples])
        if min(model.coef) >= 0:
            return model
    else:
        print("sim: warning: the traces do not vary tokens, requests and KV independently (record several "
              "fixed:G or pass --cost-model)", file=sys.stderr)
    model = EngineCostModel(coef=tuple(nonnegative_lstsq(X, y) / COST_FEATURE_SCALE))
    model.num_fit_samples = len(arr)
    return model


def fit_plain_cost(samples: list[tuple[int, int, float]]) -> EngineCostModel | None:
    """Plain decode step time a + c*R + d*K (non-negative) from the worker's plain steps; None if too few."""
    arr = np.asarray(samples, dtype=float)
    if len(arr) < 4:
        return None
    R, K, y = arr.T
    X = np.stack([np.ones_like(R), R, K], axis=1) / COST_FEATURE_SCALE[[0, 2, 3]]
    a, c, d = nonnegative_lstsq(X, y) / COST_FEATURE_SCALE[[0, 2, 3]]
    model = EngineCostModel(coef=(a, 0.0, c, d))
    model.num_fit_samples = len(arr)
    return model


def fit_affine(samples) -> tuple[float, float] | None:
    """Non-negative a + b * n from (n, seconds) samples; None without samples or when every n is the same (then a
    and b cannot be told apart and each caller has its own fallback)."""
    arr = np.asarray(samples or [], dtype=float)
    if len(arr) == 0:
        return None
    n, y = arr.T
    if len(np.unique(n)) < 2:
        return None
    a, b = nonnegative_lstsq(np.stack([np.ones_like(n), n], 1), y)
    return float(a), float(b)


@dataclass
class StepOverhead:
    """Per-step time outside the draft pass and the target forward: o0 + o1 * R (0 without timestamped traces)."""

    o0: float = 0.0
    o1: float = 0.0

    @classmethod
    def fit(cls, samples: list[tuple[int, float]] | None) -> "StepOverhead":
        # prefill steps of joining requests stay in: a closed-loop load pays them every request
        if len(samples or []) < 8:
            return cls()
        fit = fit_affine(samples)
        return cls(*fit) if fit is not None else cls(float(np.mean([y for _, y in samples])), 0.0)

    def __call__(self, num_requests: int) -> float:
        return self.o0 + self.o1 * num_requests


@dataclass
class DraftCost:
    """Draft time of one step: d0 + d1 * (requests drafted), 0 when nothing is drafted."""

    d0: float = 0.0
    d1: float = 0.0

    @classmethod
    def fit(cls, samples: list[tuple[int, float]]) -> "DraftCost":
        if not samples or sum(y for _, y in samples) <= 0:
            return cls()
        fit = fit_affine(samples)
        if fit is not None:
            return cls(*fit)
        # one batch size: a measured per-request cost
        return cls(0.0, sum(y for _, y in samples) / max(sum(n for n, _ in samples), 1.0))

    def __call__(self, num_drafted: int) -> float:
        return self.d0 + self.d1 * num_drafted if num_drafted > 0 else 0.0


class FullStepCost:
    """Cost-model view with draft time added (what the oracle optimises: the whole step, not just verify)."""

    def __init__(self, verify_cost: EngineCostModel, draft_s: float):
        self.verify_cost, self.draft_s = verify_cost, draft_s

    def predict(self, T, R, K):
        return self.verify_cost.predict(T, R, K) + self.draft_s

    def sps(self, T, R, K):
        return 1.0 / self.predict(T, R, K)


# ------------------------------------------------------------------------------------------------ simulation
def make_sim_policy(spec: str, cost: EngineCostModel, draft: DraftCost, concurrency: int, gamma: int):
    if spec == "none":
        return None
    if spec == "oracle":
        return make_policy(spec, FullStepCost(cost, draft(concurrency)), gamma=gamma)
    # a copy: online cost updates must not change the simulator's ground truth
    return make_policy(spec, copy.deepcopy(cost), gamma=gamma)


def batch_indices(pool_size: int, concurrency: int, steps: int, seed: int) -> torch.Tensor:
    """Long[steps, c] request-rows per step; the same for every policy (common random numbers)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + concurrency)
    return torch.randint(pool_size, (steps, concurrency), generator=gen)


def simulate(spec: str, data: TraceData, cost: EngineCostModel, draft: DraftCost, concurrency: int, steps: int,
             gamma: int, seed: int = 0, draft_skip: str = "probe", plain_cost: EngineCostModel | None = None,
             overhead: StepOverhead | None = None) -> dict:
    """plain_cost None: every step is costed as a verify step (no fast path, no gate)."""
    policy = make_sim_policy(spec, cost, draft, concurrency, gamma)
    gate = PlainDecodeGate() if plain_cost is not None and is_gated(spec) else None
    if gate is not None:  # the worker learns rho at its first plain step; the simulator knows it from the start
        k0 = int(data.kv_lens.float().mean() * concurrency)
        gate.observe_plain(float(plain_cost.predict(concurrency, concurrency, k0)),
                           float(cost.predict(concurrency, concurrency, k0)))
    conf_all = data.conf[:, :gamma]
    true_all = data.true_accept.clamp(max=gamma)
    streak = torch.zeros(concurrency, dtype=torch.long)  # per batch slot, as the worker's zero_streak
    savings = torch.full((concurrency,), float("nan"), dtype=torch.float64)  # and its smoothed draft savings
    probe_gate = BatchProbeGate()
    tokens = verified = accepted_total = plain_steps = drafted_total = 0
    total_s = 0.0
    last_s = None
    for step, idx in enumerate(batch_indices(len(data.true_accept), concurrency, steps, seed)):
        conf, truth, kv = conf_all[idx], true_all[idx], data.kv_lens[idx]
        kv_tokens = int(kv.sum())
        if policy is None:
            lengths = torch.zeros(concurrency, dtype=torch.long)
            drafted = 0
        else:
            active = torch.ones(concurrency, dtype=torch.bool)
            if draft_skip == "probe" and spec != "oracle":
                active = probe_gate.active(streak, step)  # the worker's schedule
                conf = torch.where(active[:, None], conf, torch.zeros_like(conf))
            ctx = BatchContext(num_requests=concurrency, kv_lens=kv, last_step_time_s=last_s, step_index=step,
                               true_accept_lens=truth,
                               plain_step_s=None if gate is None else gate.plain_step_s(concurrency, cost, kv_tokens))
            lengths = policy.choose(conf, ctx).to(torch.long).clamp(0, gamma)
            lengths = torch.where(active, lengths, torch.zeros_like(lengths))
            if gate is not None:
                lengths = gate.choose(lengths, conf, cost, kv_tokens)
            if spec == "oracle" or draft_skip == "free":
                drafted = int((lengths > 0).sum())
            else:
                drafted = int(active.sum())
            useful = lengths > 0
            if spec.split(":")[0] in PRICED_DRAFTING_POLICIES and drafted:  # as the worker (_drafting_useful)
                plain_s, verify_pred = step_prices(cost, gate, concurrency, int(lengths.sum()), kv_tokens)
                useful, savings = drafting_pays(savings, lengths, conf, active, plain_s, verify_pred,
                                                draft(drafted) / drafted)
            streak = torch.where(useful, torch.zeros_like(streak), streak + 1)
            if draft_skip == "probe" and spec != "oracle":
                probe_gate.observe(step, int(active.sum()), int(useful.sum()))
        accepted = torch.minimum(truth, lengths)
        plain = plain_cost is not None and int(lengths.sum()) == 0
        if plain:
            verify_s = float(plain_cost.predict(concurrency, concurrency, kv_tokens))
            plain_steps += 1
            if gate is not None:
                gate.observe_plain(verify_s, float(cost.predict(concurrency, concurrency, kv_tokens)))
        else:
            verify_s = float(cost.predict(concurrency + int(lengths.sum()), concurrency, kv_tokens))
        step_s = verify_s + draft(drafted) + (overhead(concurrency) if overhead is not None else 0.0)
        drafted_total += drafted
        if policy is not None and not plain:
            policy.observe(StepOutcome(verify_lens=lengths, accept_lens=accepted, step_time_s=verify_s, kv_lens=kv))
        tokens += concurrency + int(accepted.sum())
        accepted_total += int(accepted.sum())
        verified += int(lengths.sum())
        total_s += step_s
        last_s = step_s
    request_steps = steps * concurrency
    goodput = tokens / total_s
    return {"policy": spec, "concurrency": concurrency, "goodput_tok_s": round(goodput, 3),
            "per_user_tok_s": round(goodput / concurrency, 3), "tau": round(tokens / request_steps, 4),
            "mean_verify_len": round(verified / request_steps, 4),
            "wasted_per_step": round((verified - accepted_total) / steps, 3),
            "mean_step_ms": round(1e3 * total_s / steps, 3), "plain_step_share": round(plain_steps / steps, 3),
            "drafted_per_step": round(drafted_total / steps, 3)}


# ------------------------------------------------------------------------------------------------ validation
def validate(sim_rows: list[dict], serve_rows: list[dict], temperature: float, max_concurrency: int,
             simulate_missing) -> list[dict]:
    """Relative error of simulated goodput against the real server's aggregate tok/s (and tau, verify length)."""
    by_key = {(r["policy"], r["concurrency"]): r for r in sim_rows}
    out = []
    for real in serve_rows:
        if (real["policy"] in NOT_SIMULATED or real["concurrency"] > max_concurrency
                or abs(float(real["temperature"]) - temperature) > 1e-6):
            continue
        key = (real["policy"], real["concurrency"])
        if key not in by_key:
            by_key[key] = simulate_missing(*key)
        sim = by_key[key]
        row = {"policy": key[0], "concurrency": key[1], "real_tok_s": real["aggregate_tok_s"],
               "sim_tok_s": sim["goodput_tok_s"], "rel_err": _rel(sim["goodput_tok_s"], real["aggregate_tok_s"])}
        for name in ("tau", "mean_verify_len"):
            row[f"real_{name}"], row[f"sim_{name}"] = real.get(name), sim.get(name)
        out.append(row)
    return out


def _rel(sim: float, real: float | None) -> float | None:
    return round((sim - real) / real, 4) if real else None


# ------------------------------------------------------------------------------------------------ entry point
def run(args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(1)  # tiny tensors: threading only adds overhead on a shared machine
    paths = expand_paths(args.trace)
    data = load_traces(paths)
    gamma = min(args.gamma or data.gamma, data.gamma)
    cost = EngineCostModel.load(args.cost_model) if args.cost_model else fit_cost_model(data.cost_samples)
    if args.save_cost_model:
        Path(args.save_cost_model).write_text(json.dumps(cost.to_dict(), indent=2) + "\n")
    draft = DraftCost() if args.no_draft_cost else DraftCost.fit(data.draft_samples)
    plain_cost = None if args.no_plain_steps else fit_plain_cost(data.plain_samples or [])
    overhead = StepOverhead() if args.no_overhead else StepOverhead.fit(data.overhead_samples)
    if plain_cost is None and not args.no_plain_steps:
        print("sim: no plain-decode steps in the traces (record a dspark or threshold run too); l = 0 steps are "
              "costed as verify steps", file=sys.stderr)
    policies = [p.strip() for p in args.policies.split(",") if p.strip() and p.strip() not in NOT_SIMULATED]
    print(f"sim: {len(paths)} trace file(s), {len(data.true_accept)} request-rows ({data.num_censored} censored "
          f"left out), {len(data.cost_samples)} steps, gamma={gamma}, mean true accept "
          f"{data.true_accept.clamp(max=gamma).float().mean():.2f}; verify cost coef {cost.coef}; "
          f"draft d0={draft.d0:.3g}s d1={draft.d1:.3g}s/request; plain decode coef "
          f"{None if plain_cost is None else plain_cost.coef}; step overhead o0={overhead.o0:.3g}s "
          f"o1={overhead.o1:.3g}s/request", flush=True)

    def sim(policy: str, concurrency: int) -> dict:
        return simulate(policy, data, cost, draft, concurrency, args.steps, gamma, args.seed, args.draft_skip,
                        plain_cost, overhead)

    rows = [sim(p, c) for p, c in tqdm([(p, c) for p in policies for c in args.concurrency], desc="sim")]
    for r in rows:
        tqdm.write(", ".join(f"{k}={r[k]}" for k in ROW_COLUMNS))

    validation = None
    if args.validate:
        serve_data = json.loads(Path(args.validate).read_text())
        serve_rows = serve_data["rows"] if isinstance(serve_data, dict) else serve_data
        validation = validate(rows, serve_rows, args.temperature, args.validate_max_concurrency, sim)
        print_validation(validation)

    meta = {"date": dt.date.today().isoformat(), "traces": [str(p) for p in paths], "gamma": gamma,
            "steps": args.steps, "seed": args.seed, "draft_skip": args.draft_skip,
            "cost_model": args.cost_model or "fitted from traces", "verify_cost": cost.to_dict(),
            "draft_cost": {"d0": draft.d0, "d1": draft.d1}, "temperature": args.temperature,
            "plain_cost": None if plain_cost is None else plain_cost.to_dict(),
            "step_overhead": {"o0": overhead.o0, "o1": overhead.o1, "samples": len(data.overhead_samples or [])},
            "num_request_rows": len(data.true_accept), "num_censored": data.num_censored,
            "command": "python -m sglang_dspark.bench sim " + shlex.join(_cli_argv())}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "rows": rows}
    if validation is not None:
        payload["validation"] = validation
    out.write_text(json.dumps(payload, indent=2) + "\n")
    if not args.no_plots:
        plot(rows, out.with_suffix(".png"))
    if not args.no_markdown:
        body = (f"Command: `{meta['command']}` ({meta['date']}; {meta['num_request_rows']} request-rows, "
                f"gamma={gamma}, {args.steps} steps per point, cost model: {meta['cost_model']}). "
                f"Trace replay: no prefill or scheduling overhead.\n\n" + markdown_table(rows, ROW_COLUMNS))
        if validation:
            body += "\n\nValidation against the real server:\n\n" + markdown_table(validation, list(validation[0]))
        update_section("sim", body)
    return rows


def print_validation(rows: list[dict]) -> None:
    if not rows:
        print("sim: --validate found no comparable serve rows (policy, temperature, concurrency)")
        return
    print(f"{'policy':>14} {'c':>4} {'real tok/s':>11} {'sim tok/s':>10} {'rel err':>8} {'tau real/sim':>13} "
          f"{'verify real/sim':>16}")
    for r in rows:
        err = "–" if r["rel_err"] is None else f"{100 * r['rel_err']:+.1f}%"
        tau, verify = _pair(r["real_tau"], r["sim_tau"]), _pair(r["real_mean_verify_len"], r["sim_mean_verify_len"])
        print(f"{r['policy']:>14} {r['concurrency']:>4} {r['real_tok_s']:>11.2f} {r['sim_tok_s']:>10.2f} {err:>8} "
              f"{tau:>13} {verify:>16}")
    errs = [abs(r["rel_err"]) for r in rows if r["rel_err"] is not None]
    if errs:
        print(f"mean |relative error| of goodput: {100 * sum(errs) / len(errs):.1f}% over {len(errs)} points")


def _pair(a, b) -> str:
    return f"{'–' if a is None else f'{a:.2f}'}/{'–' if b is None else f'{b:.2f}'}"


def _cli_argv() -> list[str]:
    argv = sys.argv[1:]
    return argv[1:] if argv[:1] == ["sim"] else argv


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_g, ax_v) = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy in dict.fromkeys(r["policy"] for r in rows):
        lst = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["concurrency"])
        cs = [r["concurrency"] for r in lst]
        ax_g.plot(cs, [r["goodput_tok_s"] for r in lst], "o-", label=policy, markersize=3)
        ax_v.plot(cs, [r["mean_verify_len"] for r in lst], "o-", label=policy, markersize=3)
    for ax, ylabel, title in ((ax_g, "goodput tok/s", "simulated goodput"),
                              (ax_v, "mean verify length", "verify budget per request-step")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax_g.set_yscale("log")
    ax_g.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
