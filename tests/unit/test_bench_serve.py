"""bench serve without a server: resume logic, per-policy server flags, trace-derived stats, plots."""

import argparse
import json
import os

import pytest

from sglang_dspark.bench import serve
from sglang_dspark.bench.load import LoadResult, RequestResult


class FakeServer:
    started: list = []

    def __init__(self, args, env=None, startup_timeout_s=0.0, **_):
        self.args, self.env = args, env or {}
        self.base_url = f"http://fake/{len(FakeServer.started)}"
        self.log_path = None  # no worker log: wait_for_cost_model has nothing to wait for

    def start(self):
        FakeServer.started.append(self)
        os.environ["_FAKE_TRACE"] = self.env.get(serve.TRACE_ENV, "")
        return self

    def stop(self):
        os.environ.pop("_FAKE_TRACE", None)


def fake_load(calls):
    def run_load_sync(url, prompts, concurrency, max_tokens, temperature=0.0, progress=True, **_):
        calls.append((url, len(prompts), concurrency, max_tokens if progress else "warm-up", temperature))
        trace = os.environ.get("_FAKE_TRACE")
        if trace:  # what the DSPARK_EXT worker would append: 2 requests, verify 3 and 1, accept 2 and 0
            with open(trace, "a") as f:
                f.write(json.dumps({"kv_lens": [10, 12], "conf": [[0.9] * 3, [0.1] * 3], "verify_lens": [3, 1],
                                    "accept_lens": [2, 0], "draft_s": 0.001, "verify_s": 0.01}) + "\n")
        reqs = [RequestResult("gsm8k", max_tokens, 0.1, 0.1 + 0.01 * max_tokens * concurrency)
                for _ in prompts]
        return LoadResult(concurrency, 1.0 + concurrency, reqs)

    return run_load_sync


@pytest.fixture
def env(tmp_path, monkeypatch):
    FakeServer.started = []
    calls = []
    monkeypatch.setattr(serve, "ServerProcess", FakeServer)
    monkeypatch.setattr(serve, "run_load_sync", fake_load(calls))
    monkeypatch.setattr(serve, "load_prompt_list", lambda path, n: [("gsm8k", f"p{i}") for i in range(n)])
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    return tmp_path, calls, drafter


def args_for(tmp_path, drafter, *extra) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_args(parser)
    return parser.parse_args(["--out", str(tmp_path / "serve.json"), "--no-markdown", "--drafter", str(drafter),
                              "--max-tokens", "16", "--temperatures", "0", *extra])


def test_resume_skips_rows_already_measured(env):
    tmp_path, calls, drafter = env
    first = serve.run(args_for(tmp_path, drafter, "--policies", "none,dspark", "--concurrency", "1", "2"))
    assert len(first) == 4 and len(FakeServer.started) == 2
    measured = [c for c in calls if c[3] == 16]
    assert len(measured) == 4  # plus one warm-up call per server

    calls.clear()
    FakeServer.started = []
    rows = serve.run(args_for(tmp_path, drafter, "--policies", "none,dspark", "--concurrency", "1", "2", "4"))
    # only c=4 is new: both servers start once, each measures one level
    assert [c[2] for c in calls if c[3] == 16] == [4, 4]
    assert len(rows) == 6
    assert {(r["policy"], r["concurrency"]) for r in rows} == {(p, c) for p in ("none", "dspark") for c in (1, 2, 4)}

    calls.clear()
    FakeServer.started = []
    serve.run(args_for(tmp_path, drafter, "--policies", "dspark", "--concurrency", "1", "2", "4"))
    assert FakeServer.started == [] and calls == []  # everything done: no server at all

    serve.run(args_for(tmp_path, drafter, "--policies", "dspark", "--concurrency", "1", "--force"))
    assert [c[2] for c in calls if c[3] == 16] == [1]
    assert len(json.loads((tmp_path / "serve.json").read_text())["rows"]) == 6  # replaced, not duplicated


def test_changed_settings_refuse_to_mix(env):
    tmp_path, calls, drafter = env
    serve.run(args_for(tmp_path, drafter, "--policies", "none", "--concurrency", "1"))
    with pytest.raises(SystemExit, match="max_tokens"):
        serve.run(args_for(tmp_path, drafter, "--policies", "none", "--concurrency", "2", "--max-tokens", "32"))


def test_rows_stats_plots_and_server_flags(env):
    tmp_path, calls, drafter = env
    rows = serve.run(args_for(tmp_path, drafter, "--policies", "none,ngram,fixed:3,dspark-async",
                              "--concurrency", "1", "2", "--gamma", "5"))
    for r in rows:
        for col in serve.ROW_COLUMNS:
            assert col in r
    by = {(r["policy"], r["concurrency"]): r for r in rows}
    none, ngram, fixed = by[("none", 1)], by[("ngram", 1)], by[("fixed:3", 2)]
    assert none["tau"] == 1.0 and none["mean_verify_len"] == 0.0
    assert ngram["tau"] is None  # no per-request stats and no trace from SGLang's NGRAM worker
    # one fake trace step per level: requests verify 3 and 1, accept 2 and 0 -> tau (2 + 2 steps) / 2 steps
    assert fixed["tau"] == 2.0 and fixed["mean_verify_len"] == 2.0 and fixed["wasted_verify_tokens"] == 2
    assert fixed["stats_source"] == "trace"
    assert os.path.exists(fixed["trace"])  # the level's slice is kept for the simulator
    assert sum(1 for _ in open(fixed["trace"])) == 1

    flags = {tuple(s.args) for s in FakeServer.started}
    none_f, ngram_f, fixed_f, async_f = (next(f for f in flags if key(f)) for key in (
        lambda f: "--no-dspark" in f, lambda f: "NGRAM" in f,
        lambda f: "fixed:3" in f, lambda f: "dspark-async" in f))
    assert "--speculative-algorithm" not in none_f
    assert "--no-dspark" not in ngram_f and "intel_amx" in ngram_f and "--speculative-num-draft-tokens" in ngram_f
    for f in (fixed_f, async_f):
        assert f[f.index("--speculative-algorithm") + 1] == "DSPARK_EXT"
        assert f[f.index("--speculative-draft-model-path") + 1] == str(drafter)
        assert f[f.index("--dspark-gamma") + 1] == "5"
    assert (tmp_path / "serve_frontier.png").stat().st_size > 1000
    assert (tmp_path / "serve_verify_budget.png").stat().st_size > 1000


def test_table_policy_serves_the_default_with_that_table(env):
    tmp_path, _, drafter = env
    args = args_for(tmp_path, drafter, "--policies", "dspark-table:/x/old table.npz", "--concurrency", "1")
    flags = serve.server_flags("dspark-table:/x/old table.npz", args)
    assert flags[flags.index("--dspark-ngram-table") + 1] == "/x/old table.npz"
    assert flags[flags.index("--dspark-controller") + 1] == "dspark"
    assert serve.is_dspark_policy("dspark-table:/x/old table.npz")
    assert "--dspark-ngram-table" not in serve.server_flags("dspark", args)


def test_missing_drafter_is_a_clear_error(env, tmp_path):
    _, _, drafter = env
    with pytest.raises(SystemExit, match="drafter"):
        serve.run(args_for(tmp_path, tmp_path / "nope", "--policies", "dspark", "--concurrency", "1"))


def _log(tmp_path, *lines):
    path = tmp_path / "server.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_wait_for_cost_model(tmp_path, monkeypatch):
    monkeypatch.setattr(serve.time, "sleep", lambda s: None)
    never = lambda: pytest.fail("must not drive load")  # noqa: E731
    cached = _log(tmp_path, "[x] DSPARK_EXT cost model: /cache/abc.json (coef=[1, 2, 3, 4])")
    assert serve.wait_for_cost_model(cached, 0.0, never, 60) == "/cache/abc.json"
    assert serve.wait_for_cost_model(tmp_path / "missing.log", 0.0, never, 60) == "unknown"
    assert serve.wait_for_cost_model(_log(tmp_path, "[x] DSPARK_EXT cost model: prior (coef=[])"), 0.0, never, 60,
                                      profiling_allowed=False) == "prior"

    # profiling pending, launcher load over: drive traffic until the worker logs the fit
    log = _log(tmp_path, "[x] DSPARK_EXT cost model: prior (coef=[])")
    drives = []

    def drive():
        drives.append(1)
        if len(drives) == 3:
            log.write_text(log.read_text() + "[y] DSPARK_EXT cost model profiled from 84 steps: coef=[]\n")

    healthy_at = serve.time.time() - serve.LAUNCHER_PROFILE_LOAD_S - 1
    assert serve.wait_for_cost_model(log, healthy_at, drive, 600) == "profiled"
    assert len(drives) == 3
    # the launcher's load is still in its last level when the fit is logged: wait for its done line
    log = _log(tmp_path, "[x] DSPARK_EXT cost model: prior (coef=[])", serve.profile_warmup.STARTED_LINE,
               "[y] DSPARK_EXT cost model profiled from 84 steps: coef=[]")
    polls = []

    def sleep(s):
        polls.append(s)
        if len(polls) == 4:
            log.write_text(log.read_text() + serve.profile_warmup.DONE_LINE + "\n")

    monkeypatch.setattr(serve.time, "sleep", sleep)
    assert serve.wait_for_cost_model(log, serve.time.time(), never, 600) == "profiled"
    assert len(polls) == 4
    monkeypatch.setattr(serve.time, "sleep", lambda s: None)
    # never finishes: give up at the timeout instead of hanging
    stuck = _log(tmp_path, "[x] DSPARK_EXT cost model: prior (coef=[])")
    assert "unfinished" in serve.wait_for_cost_model(stuck, serve.time.time() - 700, lambda: None, 600)


def test_url_mode_and_markdown(env, monkeypatch):
    tmp_path, calls, drafter = env
    sections = {}
    monkeypatch.setattr(serve, "update_section", lambda name, body: sections.setdefault(name, body))
    with pytest.raises(SystemExit, match="--url"):
        serve.run(args_for(tmp_path, drafter, "--url", "http://x:1", "--policies", "none,dspark"))
    args = args_for(tmp_path, drafter, "--url", "http://x:1/", "--policies", "dspark", "--concurrency", "2")
    args.no_markdown = False
    rows = serve.run(args)
    assert FakeServer.started == [] and {c[0] for c in calls} == {"http://x:1"}
    assert rows[0]["policy"] == "dspark" and rows[0]["tau"] is None  # no trace file given for that server
    body = sections["serve"]
    assert "python -m sglang_dspark.bench serve" in body and "| policy | concurrency | temperature |" in body


def test_matched_aggregate_gain_interpolates_along_the_frontier():
    from sglang_dspark.bench.serve import matched_aggregate_gain

    rows = [{"policy": "dspark", "temperature": 0.0, "aggregate_tok_s": a, "per_user_tok_s_median": u}
            for a, u in [(10, 10), (30, 6), (50, 2)]]
    rows += [{"policy": "fixed:1", "temperature": 0.0, "aggregate_tok_s": a, "per_user_tok_s_median": u}
             for a, u in [(5, 5), (20, 4), (40, 1), (60, 0.5)]]
    gains = matched_aggregate_gain(rows, "dspark", "fixed:1")
    # 5 and 60 are outside dspark's measured range; 20 -> 8 per user (+100%), 40 -> 4 (+300%)
    assert [(g["aggregate_tok_s"], g["dspark_per_user"], g["gain"]) for g in gains] == [(20, 8.0, 1.0), (40, 4.0, 3.0)]


def test_policy_variants_switch_one_part_of_dspark_ext(tmp_path):
    import argparse

    from sglang_dspark.bench.serve import server_flags

    (tmp_path / "config.json").write_text("{}")
    args = argparse.Namespace(model=None, server_args="", drafter=str(tmp_path), gamma=None, cost_model=None,
                              ngram_args="")
    off = server_flags("dspark-noretrieval", args)
    assert off[off.index("--dspark-controller") + 1] == "dspark" and off[-2:] == ["--dspark-retrieval", "off"]
    only = server_flags("retrieval-only", args)
    assert "--dspark-no-model-drafts" in only and "--dspark-retrieval" not in only
    assert "--dspark-retrieval" not in server_flags("dspark", args)  # the default: both sources
    gemm_off = server_flags("dspark-gemm-off", args)
    assert gemm_off[gemm_off.index("--dspark-cpu-gemm") + 1] == "off" and "DSPARK_EXT" in gemm_off
    assert server_flags("none-gemm-off", args) == ["--no-dspark", "--dspark-cpu-gemm", "off"]
    assert server_flags("none-gemm-64", args) == ["--no-dspark", "--dspark-cpu-gemm-rows", "64"]
    assert "--dspark-cpu-gemm" not in server_flags("none", args)
