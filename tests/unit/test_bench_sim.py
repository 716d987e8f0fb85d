"""Trace-replay simulator on a synthetic trace with known acceptance process and known step cost."""

import argparse
import json

import pytest
import torch

from sglang_dspark.bench import sim

GAMMA = 5
# verify step seconds = a + b*T + c*R + d*K; draft seconds = d0 + d1*R
COST = (0.004, 0.0006, 0.0004, 2e-7)
DRAFT = (0.001, 0.0002)


def write_trace(path, steps: int = 120, seed: int = 0) -> None:
    """Calibrated confidences (A is drawn from exactly those per-position probabilities); most steps verify all G
    drafts (true lengths), some fixed:2 steps (censored rows, but they vary T/R for the cost fit)."""
    gen = torch.Generator().manual_seed(seed)
    with open(path, "w") as f:
        for s in range(steps):
            R = [1, 2, 4, 8][s % 4]
            easy = torch.rand(R, 1, generator=gen)  # per-request difficulty: confident and doubtful requests
            conf = (0.15 + 0.8 * easy) * torch.ones(R, GAMMA) - 0.05 * torch.rand(R, GAMMA, generator=gen)
            ok = torch.rand(R, GAMMA, generator=gen) < conf
            true = torch.cumprod(ok.long(), 1).sum(1)
            verify = torch.full((R,), GAMMA if s % 3 else 2)
            accept = torch.minimum(true, verify)
            kv = torch.randint(50, 400, (R,), generator=gen)
            T, K = int(R + verify.sum()), int(kv.sum())
            f.write(json.dumps({
                "kv_lens": kv.tolist(), "conf": conf.tolist(), "conf_logits": conf.logit().tolist(),
                "verify_lens": verify.tolist(), "accept_lens": accept.tolist(),
                "draft_s": DRAFT[0] + DRAFT[1] * R,
                "verify_s": COST[0] + COST[1] * T + COST[2] * R + COST[3] * K,
            }) + "\n")


def sim_args(tmp_path, trace, **kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sim.add_args(parser)
    ns = parser.parse_args(["--trace", str(trace), "--out", str(tmp_path / "sim.json"), "--no-markdown",
                            "--steps", "40", "--concurrency", "1", "4", "32",
                            "--policies", "none,fixed:1,fixed:5,dspark,dspark-async,sps-topk,oracle"])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    write_trace(path)
    return path


def test_load_traces_drops_censored_rows(trace):
    data = sim.load_traces([trace])
    assert data.gamma == GAMMA
    assert data.num_censored > 0
    # a fixed:2 row with accept == 2 is censored; every kept row is either fully verified or was rejected early
    assert int(data.true_accept.max()) <= GAMMA
    assert len(data.cost_samples) == 120


def test_cost_and_draft_fit_recover_the_truth(trace):
    data = sim.load_traces([trace])
    fitted = sim.fit_cost_model(data.cost_samples)
    for T, R, K in [(8, 1, 300), (200, 32, 8000), (40, 32, 8000)]:
        truth = COST[0] + COST[1] * T + COST[2] * R + COST[3] * K
        assert fitted.predict(T, R, K) == pytest.approx(truth, rel=1e-3)
    draft = sim.DraftCost.fit(data.draft_samples)
    assert (draft.d0, draft.d1) == pytest.approx(DRAFT, rel=1e-6)
    assert draft(0) == 0.0


def test_policy_ordering_and_outputs(tmp_path, trace):
    rows = sim.run(sim_args(tmp_path, trace))
    good = {(r["policy"], r["concurrency"]): r for r in rows}
    for c in (1, 4, 32):
        oracle, dspark, fixed1 = (good[(p, c)]["goodput_tok_s"] for p in ("oracle", "dspark", "fixed:1"))
        assert oracle >= dspark >= fixed1, (c, oracle, dspark, fixed1)
        assert good[("none", c)]["tau"] == 1.0 and good[("none", c)]["mean_verify_len"] == 0.0
        assert good[("fixed:5", c)]["mean_verify_len"] == GAMMA
    # under load the verify budget shrinks
    assert good[("dspark", 32)]["mean_verify_len"] < good[("dspark", 1)]["mean_verify_len"]
    saved = json.loads((tmp_path / "sim.json").read_text())
    assert len(saved["rows"]) == len(rows) and saved["meta"]["gamma"] == GAMMA
    assert (tmp_path / "sim.png").stat().st_size > 1000


def test_oracle_never_verifies_past_the_true_length(trace):
    data = sim.load_traces([trace])
    cost = sim.fit_cost_model(data.cost_samples)
    row = sim.simulate("oracle", data, cost, sim.DraftCost(*DRAFT), 8, 30, GAMMA)
    assert row["wasted_per_step"] == 0.0


def test_validate_reports_relative_error(tmp_path, trace, capsys):
    serve = [{"policy": "fixed:1", "concurrency": 4, "temperature": 0.0, "aggregate_tok_s": 100.0, "tau": 1.5},
             {"policy": "fixed:1", "concurrency": 64, "temperature": 0.0, "aggregate_tok_s": 1.0},  # c > 16
             {"policy": "ngram", "concurrency": 4, "temperature": 0.0, "aggregate_tok_s": 1.0},  # not simulated
             {"policy": "dspark", "concurrency": 2, "temperature": 1.0, "aggregate_tok_s": 1.0},  # other T
             {"policy": "dspark", "concurrency": 2, "temperature": 0.0, "aggregate_tok_s": 50.0}]  # c not simulated yet
    (tmp_path / "serve.json").write_text(json.dumps({"meta": {}, "rows": serve}))
    rows = sim.run(sim_args(tmp_path, trace, validate=str(tmp_path / "serve.json"), no_plots=True))
    val = json.loads((tmp_path / "sim.json").read_text())["validation"]
    assert [(v["policy"], v["concurrency"]) for v in val] == [("fixed:1", 4), ("dspark", 2)]
    sim_fixed = next(r for r in rows if r["policy"] == "fixed:1" and r["concurrency"] == 4)["goodput_tok_s"]
    assert val[0]["rel_err"] == pytest.approx((sim_fixed - 100.0) / 100.0, abs=1e-4)
    assert val[0]["real_tau"] == 1.5 and val[0]["sim_tau"] is not None
    assert "rel err" in capsys.readouterr().out


def test_draft_count_honours_draft_skipping():
    drafted = [[0.5, 0.2], [sim.SKIPPED_CONF_LOGIT] * 2, [1.0, sim.SKIPPED_CONF_LOGIT]]
    assert sim.num_drafted({"verify_lens": [1, 0, 1], "conf_logits": drafted}) == 2
    assert sim.num_drafted({"verify_lens": [1, 0, 1], "drafted": [1, 0, 0]}) == 1
    assert sim.num_drafted({"verify_lens": [1, 0, 1]}) == 3


def test_cost_fit_never_goes_negative():
    gen = torch.Generator().manual_seed(3)
    T = torch.randint(1, 200, (60,), generator=gen).tolist()
    R = torch.randint(1, 32, (60,), generator=gen).tolist()
    K = torch.randint(100, 20000, (60,), generator=gen).tolist()
    # measured time falls with KV (noise in a short trace): a plain fit extrapolates to zero time at high load
    samples = [(t, r, k, 0.05 + 0.001 * t - 2e-6 * k) for t, r, k in zip(T, R, K)]
    model = sim.fit_cost_model(samples)
    assert min(model.coef) >= 0
    assert model.predict(256 * 8, 256, 256 * 2000) > 0.05
    # one fixed:G trace: T = 5R exactly; still a usable non-negative model that fits the samples
    line = [(5 * r, r, 300 * r, 0.01 + 0.002 * 5 * r) for r in range(1, 20)]
    model = sim.fit_cost_model(line)
    assert min(model.coef) >= 0
    assert model.predict(50, 10, 3000) == pytest.approx(0.11, rel=1e-3)


PLAIN = (0.003, 0.0002, 1e-7)  # plain decode seconds = a + c*R + d*K


def add_plain_steps(path, steps: int = 40, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with open(path, "a") as f:
        for s in range(steps):
            R = [1, 2, 4, 8][s % 4]
            kv = torch.randint(50, 400, (R,), generator=gen)
            f.write(json.dumps({
                "kv_lens": kv.tolist(), "conf": [[0.0] * GAMMA] * R, "conf_logits": [[-30.0] * GAMMA] * R,
                "verify_lens": [0] * R, "accept_lens": [0] * R, "draft_s": 0.0, "plain": True, "drafted": [0] * R,
                "verify_s": PLAIN[0] + PLAIN[1] * R + PLAIN[2] * int(kv.sum())}) + "\n")


def test_plain_steps_are_fitted_apart_from_verify_steps(trace):
    add_plain_steps(trace)
    data = sim.load_traces([trace])
    assert len(data.cost_samples) == 120 and len(data.plain_samples) == 40  # plain rows do not pollute the verify fit
    plain = sim.fit_plain_cost(data.plain_samples)
    assert plain.predict(4, 4, 1000) == pytest.approx(PLAIN[0] + 4 * PLAIN[1] + 1000 * PLAIN[2], rel=1e-3)
    verify = sim.fit_cost_model(data.cost_samples)
    assert verify.predict(20, 4, 1000) == pytest.approx(COST[0] + 20 * COST[1] + 4 * COST[2] + 1000 * COST[3],
                                                        rel=1e-3)
    # `none` runs plain decode steps and drafts nothing
    none = sim.simulate("none", data, verify, sim.DraftCost(*DRAFT), 4, 20, GAMMA, plain_cost=plain)
    assert none["plain_step_share"] == 1.0 and none["drafted_per_step"] == 0.0


def test_probe_schedule_drafts_only_on_probe_steps(trace):
    data = sim.load_traces([trace])
    cost = sim.fit_cost_model(data.cost_samples)
    plain = sim.EngineCostModel(coef=(PLAIN[0], 0.0, PLAIN[1], PLAIN[2]))
    # threshold:1.0 never verifies: every slot probes at streaks 0, 4, 8, 16, 32 -> 5 drafted steps of 40
    row = sim.simulate("threshold:1.0", data, cost, sim.DraftCost(*DRAFT), 4, 40, GAMMA, draft_skip="probe",
                       plain_cost=plain)
    assert row["drafted_per_step"] == pytest.approx(5 * 4 / 40)
    assert row["plain_step_share"] == 1.0 and row["mean_verify_len"] == 0.0
    off = sim.simulate("threshold:1.0", data, cost, sim.DraftCost(*DRAFT), 4, 40, GAMMA, draft_skip="off",
                       plain_cost=plain)
    assert off["drafted_per_step"] == 4 and off["goodput_tok_s"] < row["goodput_tok_s"]


def test_gate_turns_expensive_verify_into_plain_steps(trace):
    data = sim.load_traces([trace])
    expensive = sim.EngineCostModel(coef=(0.05, 0.01, 0.01, 0.0))  # verify >= 130 ms at R = 4, plain ~25 ms
    plain = sim.EngineCostModel(coef=(0.02, 0.0, 0.001, 0.0))
    gated = sim.simulate("fixed:2", data, expensive, sim.DraftCost(*DRAFT), 4, 30, GAMMA, plain_cost=plain)
    assert gated["plain_step_share"] == 0.0  # fixed:G keeps its lengths (no gate), as in the worker
    row = sim.simulate("sps-topk", data, expensive, sim.DraftCost(*DRAFT), 4, 30, GAMMA, plain_cost=plain)
    assert row["plain_step_share"] > 0.9


def test_step_overhead_comes_from_trace_timestamps(tmp_path):
    """Rows with wall-clock "t": the gap between steps minus draft + forward is the overhead o0 + o1 * R."""
    path = tmp_path / "t.jsonl"
    t, lines = 100.0, []
    for s in range(40):
        R = [1, 2, 4, 8][s % 4]
        draft_s, verify_s = 0.01, 0.05 + 0.01 * R
        t += draft_s + verify_s + 0.002 + 0.001 * R
        lines.append(json.dumps({"kv_lens": [100] * R, "conf": [[0.5] * GAMMA] * R, "conf_logits": [[0.0] * GAMMA] * R,
                                 "verify_lens": [GAMMA] * R, "accept_lens": [1] * R, "draft_s": draft_s,
                                 "verify_s": verify_s, "t": t}))
    lines.append(json.dumps({"kv_lens": [100], "conf": [[0.5] * GAMMA], "conf_logits": [[0.0] * GAMMA],
                             "verify_lens": [GAMMA], "accept_lens": [1], "draft_s": 0.01, "verify_s": 0.06,
                             "t": t + 30.0}))  # idle gap between levels: not overhead
    path.write_text("\n".join(lines) + "\n")
    data = sim.load_traces([path])
    assert len(data.overhead_samples) == 39
    over = sim.StepOverhead.fit(data.overhead_samples)
    assert (over.o0, over.o1) == (pytest.approx(0.002, abs=1e-6), pytest.approx(0.001, abs=1e-6))
    assert sim.StepOverhead.fit([]) (4) == 0.0
