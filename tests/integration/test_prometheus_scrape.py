"""DSpark metrics end to end: a real SGLang server (CPU, tiny bigram target + matching drafter, --enable-metrics),
a real Prometheus (loopback only, started here) scraping it, a short mixed load; then
  - /metrics counters equal the per-request `dspark` records summed (exactly), and Prometheus has the same values
    (streamed requests separately);
  - EVERY PromQL expression of deploy/grafana/dashboards/sglang-dspark.json returns data through Prometheus's API;
  - /metrics carries no prompt or completion text;
  - render_dashboard draws the panels into a PNG.
Prometheus comes from scripts/install_prometheus.sh (apt); the test skips only if that cannot install it.
Run: .venv/bin/pytest -q tests/integration/test_prometheus_scrape.py   (about 1-3 minutes on 2 busy cores)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
pytest.importorskip("sglang")
prometheus_client = pytest.importorskip("prometheus_client")
yaml = pytest.importorskip("yaml")

from sglang_dspark.bench.server import ServerProcess, free_port  # noqa: E402
from sglang_dspark.metrics.render_dashboard import render, substitute  # noqa: E402
from tests.tiny_dspark import build_matching_drafter, build_tiny_pair, make_bigram_target  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "sglang-dspark.json"
INJECTED_NAN_STEPS = 2
SCRAPE_S = 1
STREAMS = 2  # streaming requests, after the rest of the load
MARKER = "zebraquartz"  # in every prompt; must never show up on /metrics
COUNTERS = {  # /metrics counter -> key of the per-request record it sums
    "sglang:dspark_verify_steps_total": "verify_steps",
    "sglang:dspark_bonus_tokens_total": "verify_steps",
    "sglang:dspark_draft_steps_total": "draft_steps",
    "sglang:dspark_verified_tokens_total": "verified",
    "sglang:dspark_accepted_tokens_total": "accepted",
    "sglang:dspark_wasted_verify_tokens_total": "wasted",
}


def prometheus_binary() -> str:
    if shutil.which("prometheus") is None:
        out = subprocess.run(["bash", str(REPO / "scripts" / "install_prometheus.sh")], capture_output=True, text=True,
                             timeout=600)
        if out.returncode != 0 or shutil.which("prometheus") is None:
            pytest.skip(f"cannot install prometheus: {out.stderr[-500:]}")
    return shutil.which("prometheus")


def http_json(url: str, payload: dict | None = None, timeout: float = 120.0):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def prom_query(base: str, expr: str, at: float | None = None) -> list[dict]:
    params = {"query": expr} | ({"time": at} if at else {})
    body = http_json(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}")
    assert body["status"] == "success", body
    return body["data"]["result"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dspark_metrics")
    target, _ = build_tiny_pair(root)
    make_bigram_target(target, logit_scale=0.5)  # flatter: sampled requests get drafts rejected (~15%)
    return target, build_matching_drafter(target, root / "matching_drafter", noise=0.5)


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    target, drafter = models
    args = ["--model-path", str(target), "--enable-metrics", "--speculative-algorithm", "DSPARK_EXT",
            "--speculative-draft-model-path", str(drafter), "--dtype", "float32", "--max-total-tokens", "8192",
            "--skip-server-warmup", "--attention-backend", "torch_native",
            "--dspark-no-profile",  # no launcher warm-up load: every request-step must be one of ours
            "--dspark-controller", "fixed:4"]  # verify every draft: acceptance by position, rejections, waste
    env = {"SGLANG_PLUGINS": "dspark_ext", "SGLANG_DSPARK_INJECT_NAN_STEPS": str(INJECTED_NAN_STEPS)}
    log = tmp_path_factory.mktemp("logs") / "server.log"
    with ServerProcess(args, env=env, log_path=log, startup_timeout_s=240) as srv:
        yield srv


@pytest.fixture(scope="module")
def prometheus(server, tmp_path_factory):
    binary = prometheus_binary()
    work = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    # the shipped config (its metric-name normalisation included), pointed at our server and scraping every second
    cfg = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"}
    cfg["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{server.port}"]}]
    (work / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
    log = open(work / "prometheus.log", "w")
    proc = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("prometheus did not start:\n" + (work / "prometheus.log").read_text()[-2000:])
                time.sleep(0.5)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def generate(base_url: str, i: int, max_new_tokens: int) -> dict:
    sampled = i % 2 == 1  # half greedy (prefix match), half sampled (rejection sampling)
    params = {"max_new_tokens": max_new_tokens, "ignore_eos": True,
              "temperature": 0.8 if sampled else 0.0, "top_p": 0.95 if sampled else 1.0}
    if i % 4 == 2:  # a per-request SLA floor no CPU step can meet: floored and unmet counters both move
        params["custom_params"] = {"dspark_min_user_tps": 1e6}
    body = {"text": f"{MARKER} request {i}: the cat sat on", "sampling_params": params}
    out = http_json(f"{base_url}/generate", body)
    return {"text": out["text"], "record": out["meta_info"].get("dspark"), "n": max_new_tokens, "stream": False}


def generate_stream(base_url: str, i: int, max_new_tokens: int) -> dict:
    """Streaming /generate: the record arrives with the last chunk."""
    body = {"text": f"{MARKER} stream {i}: the dog ran to", "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0}}
    req = urllib.request.Request(f"{base_url}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    last = None
    with urllib.request.urlopen(req, timeout=120) as resp:
        for line in resp:
            line = line.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                last = json.loads(line[len("data:"):])
    return {"text": last["text"], "record": last["meta_info"].get("dspark"), "n": max_new_tokens, "stream": True}


@pytest.fixture(scope="module")
def run(server, prometheus):
    """The load: one request alone (it takes the injected fallback steps), then 16 at concurrency 4, one of them
    finishing in prefill (no DSpark step, no record); then STREAMS streaming ones alone. Waits until Prometheus has
    scraped the final state."""
    # start from a scraped baseline: Prometheus has seen our series (at zero) at least twice
    deadline = time.time() + 60
    while not prom_query(prometheus, "count_over_time(sglang:dspark_verify_steps_total[1m]) >= 2"):
        assert time.time() < deadline, "Prometheus never scraped the server"
        time.sleep(0.5)
    t0 = time.time()
    results = [generate(server.base_url, 0, 16)]
    with ThreadPoolExecutor(4) as pool:
        lens = [1 if i == 5 else 20 + (i % 3) * 8 for i in range(1, 17)]
        results += list(pool.map(lambda a: generate(server.base_url, *a), enumerate(lens, start=1)))
    metrics_text = urllib.request.urlopen(server.base_url + "/metrics", timeout=30).read().decode()
    streams = [generate_stream(server.base_url, i, 24) for i in range(STREAMS)]  # alone: their counter delta
    metrics_final = urllib.request.urlopen(server.base_url + "/metrics", timeout=30).read().decode()
    time.sleep(3 * SCRAPE_S)  # let Prometheus scrape the final values
    return {"results": results, "streams": streams, "metrics_text": metrics_text, "metrics_final": metrics_final,
            "t0": t0, "eval_at": time.time()}


def metric_values(text: str) -> dict[str, float]:
    """sample name -> value summed over label sets (one server, one scheduler)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def test_counters_equal_request_records_summed(run, prometheus):
    records = [r["record"] for r in run["results"] if r["record"]]
    assert len(records) == len(run["results"]) - 1  # the 1-token request finished in prefill: no DSpark step
    assert sum(r["accepted"] for r in records) > 0, "the matching drafter should get drafts accepted"
    assert sum(r["wasted"] for r in records) > 0, "noise=0.5 and fixed:4 should get some drafts rejected"
    # a complete record commits at least max_new_tokens: 1 prefill token + (accepted + 1) per step
    short = [r for r in run["results"]
             if r["record"] and 1 + r["record"]["accepted"] + r["record"]["verify_steps"] < r["n"]]
    assert not short, f"incomplete per-request records: {short}"
    values = metric_values(run["metrics_text"])
    for name, key in COUNTERS.items():
        assert values[name] == sum(r[key] for r in records), name
    gamma = int(prom_query(prometheus, "sglang:dspark_controller_info")[0]["metric"]["gamma"])
    assert values["sglang:dspark_drafted_tokens_total"] == gamma * sum(r["draft_steps"] for r in records)
    assert values["sglang:dspark_fallbacks_total"] == INJECTED_NAN_STEPS  # both reasons summed; only nan injected
    assert values["sglang:dspark_accept_length_count"] == sum(r["verify_steps"] for r in records)
    assert values["sglang:dspark_accept_length_sum"] == sum(r["accepted"] for r in records)
    assert values["sglang:dspark_verify_length_sum"] == sum(r["verified"] for r in records)
    assert values["sglang:dspark_request_mean_tau_count"] == len(records)
    taus = [(r["accepted"] + r["verify_steps"]) / r["verify_steps"] for r in records]
    assert values["sglang:dspark_request_mean_tau_sum"] == pytest.approx(sum(taus), rel=1e-9)
    # Prometheus scraped the same final values
    final = metric_values(run["metrics_final"])
    for name in COUNTERS:
        got = prom_query(prometheus, f"sum({name})", run["eval_at"])
        assert got and float(got[0]["value"][1]) == final[name], name


def test_streaming_counters_equal_request_records_summed(run):
    """The streamed requests ran alone after the rest: the counters' delta over them equals their records."""
    assert run["streams"]
    records = [r["record"] or {} for r in run["streams"]]
    before, after = metric_values(run["metrics_text"]), metric_values(run["metrics_final"])
    for name, key in COUNTERS.items():
        assert after[name] - before[name] == sum(r.get(key, 0) for r in records), name


def _retrieval_served(prometheus, at: float) -> bool:
    """Whether any request-step was drafted by a retrieval source (prompt/output lookup, corpus): only then does
    sglang:dspark_retrieval_ece (RETRIEVAL_ONLY) have samples."""
    got = prom_query(prometheus, 'sum(sglang:dspark_request_steps_by_source_total{source=~"prompt|corpus"})', at)
    return bool(got) and float(got[0]["value"][1]) > 0


RETRIEVAL_ONLY = "sglang:dspark_retrieval_ece"
GATED_ONLY = "sglang:dspark_gate_"  # the plain-decode gate's ratios: only gated controllers have a gate


def _gated(prometheus, at: float) -> bool:
    from sglang_dspark.control.plain_decode import is_gated

    got = prom_query(prometheus, "sglang:dspark_controller_info", at)
    return bool(got) and is_gated(got[0]["metric"].get("controller", ""))


def _dashboard_failures(prometheus, t0: float, eval_at: float) -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    window = f"{int(eval_at - t0) + 10}s"  # the whole load, so rate() has many samples
    retrieval = _retrieval_served(prometheus, eval_at)
    gated = _gated(prometheus, eval_at)
    failures = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = substitute(target["expr"], rate_interval=window)
            result = prom_query(prometheus, expr, eval_at)
            finite = [float(r["value"][1]) for r in result if math.isfinite(float(r["value"][1]))]
            if not result and not retrieval and RETRIEVAL_ONLY in expr:
                continue  # no retrieval drafts served by this server: no retrieval ECE yet
            if not result and not gated and GATED_ONLY in expr:
                continue  # fixed:G and the other baselines run without the plain-decode gate
            if not finite:
                failures.append(f"[{panel['title']}] {target['legendFormat']}: {expr} -> {result}")
    return failures


def test_every_dashboard_expression_returns_data(run, prometheus, server):
    failures = _dashboard_failures(prometheus, run["t0"], run["eval_at"])
    if failures:
        # SGLang's own request histograms get their first sample only when the first requests finish; on this tiny
        # model the whole load can fit between two scrapes, leaving rate() over SGLang series at 0/0. Drive a little
        # more traffic and ask again: every expression must still return finite data.
        for i in range(3):
            generate(server.base_url, 100 + i, 8)
        time.sleep(3 * SCRAPE_S)
        failures = _dashboard_failures(prometheus, run["t0"], time.time())
    assert not failures, "dashboard expressions without data:\n" + "\n".join(failures)


def test_sla_floor_from_the_request_is_counted_and_bad_values_are_400(run, server):
    final = metric_values(run["metrics_final"])
    assert final["sglang:dspark_sla_floored_request_steps_total"] > 0
    assert final["sglang:dspark_sla_unsatisfied_request_steps_total"] > 0
    body = {"text": "x", "sampling_params": {"max_new_tokens": 2, "custom_params": {"dspark_min_user_tps": -3}}}
    with pytest.raises(urllib.error.HTTPError) as err:
        http_json(f"{server.base_url}/generate", body)
    assert err.value.code == 400
    assert "dspark_min_user_tps" in err.value.read().decode()


@pytest.mark.parametrize("key,bad", [("dspark_draft_temperature", -1), ("dspark_draft_temperature", "hot"),
                                     ("dspark_max_verify", -1), ("dspark_max_verify", 1.5)])
def test_bad_per_request_dspark_params_are_400(server, key, bad):
    body = {"text": "x", "sampling_params": {"max_new_tokens": 2, "custom_params": {key: bad}}}
    with pytest.raises(urllib.error.HTTPError) as err:
        http_json(f"{server.base_url}/generate", body)
    assert err.value.code == 400
    assert key in err.value.read().decode()


def test_metrics_carry_no_prompt_or_completion_text(run):
    text = run["metrics_final"]
    assert MARKER not in text
    for r in run["results"] + run["streams"]:
        completion = r["text"].strip()
        if len(completion) >= 12:  # short strings could occur by chance (e.g. "0.0")
            assert completion not in text


def test_render_dashboard_png(run, prometheus, tmp_path):
    out = Path(os.environ.get("SGLANG_DSPARK_DASHBOARD_PNG", tmp_path / "dashboard.png"))
    counts = render(json.loads(DASHBOARD.read_text()), prometheus, out, run["t0"] - 5, run["eval_at"],
                    rate_interval="15s")
    assert out.stat().st_size > 10_000
    dashboard = json.loads(DASHBOARD.read_text())
    optional = set() if _retrieval_served(prometheus, run["eval_at"]) else {
        p["title"] for p in dashboard["panels"] if all(RETRIEVAL_ONLY in t["expr"] for t in p["targets"])}
    if not _gated(prometheus, run["eval_at"]):
        optional |= {p["title"] for p in dashboard["panels"] if all(GATED_ONLY in t["expr"] for t in p["targets"])}
    assert all(n > 0 for title, n in counts.items() if title not in optional), counts
