"""Scaling out: DSPARK_EXT under tensor parallelism (TP = 2 on the CPU engine, over gloo) and data-parallel replicas
behind sglang-router.

TP = 2, embedded model, float32, greedy: token-identical to the TP = 1 server without speculation; then 32 mixed
T = 0 / T = 1 requests, 8 at a time, complete, and the KV pool is back to its baseline. Every step's plan is rank
0's (sglang_plugin/rank_sync.py): without the broadcasts the ranks' verify lengths differ and the run hangs.
DP: two DSPARK_EXT replicas behind `sglang_router.launch_router` serve 32 requests through the router, both
replicas serve some, and a real Prometheus scrape sees `sglang:dspark_*` series from both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.conftest import REPO, Server, _free_port, dspark_args, post_json
from tests.integration.test_dspark_openai_api import _wait_idle
from tests.integration.test_prometheus_scrape import prom_query, prometheus_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

TARGET = REPO / "models" / "qwen2.5-coder-0.5b-instruct"
DRAFTER = REPO / "models" / "drafters" / "dspark-qwen2.5-coder-0.5b-instruct"
PROMPTS = ["def fibonacci(n):", "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:",
           "Write a Python function that reverses a string.\n", "The three laws of thermodynamics are",
           "import numpy as np\n\ndef normalize(x):", "class Stack:\n    def __init__(self):",
           "Explain what a hash map is in one paragraph.\n", "SELECT name, COUNT(*) FROM users"]
TOKENS = 24


def _embedded(tp: int, spec: bool) -> list[str]:
    args = ["--model-path", str(TARGET), "--dtype", "float32", "--max-total-tokens", "4096", "--skip-server-warmup",
            "--attention-backend", "torch_native", "--device", "cpu", "--tp-size", str(tp)]
    if not spec:
        return args + ["--no-dspark"]
    return args + ["--speculative-algorithm", "DSPARK_EXT", "--speculative-draft-model-path", str(DRAFTER),
                   "--dspark-controller", "dspark", "--dspark-no-profile"]


def _greedy(server: Server) -> list[list[int]]:
    out = post_json(server.url + "/generate", {"text": PROMPTS, "sampling_params": {
        "max_new_tokens": TOKENS, "temperature": 0.0, "ignore_eos": True}})
    return [o["output_ids"] for o in out]


@pytest.fixture(scope="module")
def embedded():
    missing = [p for p in (TARGET, DRAFTER) if not (p / "config.json").exists()]
    if missing:
        pytest.skip(f"not installed (run `make setup`): {', '.join(map(str, missing))}")


def test_tp2_greedy_is_lossless_and_mixed_load_leaves_no_kv(embedded, log_dir):
    with Server("tp1_plain", _embedded(1, False), None, log_dir) as plain:
        want = _greedy(plain)
    with Server("tp2_dspark", _embedded(2, True), None, log_dir) as srv:
        assert "rank 1" in srv.log_text() or "TP1" in srv.log_text(), "the server did not start two TP ranks"
        before = _wait_idle(srv)
        got = _greedy(srv)
        for p, a, b in zip(PROMPTS, want, got):
            assert a == b, f"TP=2 DSPARK_EXT diverged from TP=1 without speculation on {p!r}"

        def one(i: int) -> int:
            params = {"max_new_tokens": 16, "ignore_eos": True, "temperature": 0.0 if i % 2 else 1.0}
            return len(post_json(srv.url + "/generate", {"text": PROMPTS[i % len(PROMPTS)],
                                                        "sampling_params": params}, timeout=900)["output_ids"])

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(32))) == [16] * 32
        after = _wait_idle(srv)
        assert after["num_used_tokens"] == before["num_used_tokens"], f"KV leak: {before} -> {after}"
        assert srv.alive()


# ---------------------------------------------------------------------------------------------------- DP
class Router:
    def __init__(self, workers: list[str], log_dir) -> None:
        self.port, self.metrics_port = _free_port(), _free_port()
        self.cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *workers,
                    "--policy", "round_robin", "--host", "127.0.0.1", "--port", str(self.port),
                    "--prometheus-port", str(self.metrics_port), "--prometheus-host", "127.0.0.1"]
        self.log_path = log_dir / "router.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Router":
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        # the router is up before it has registered its workers (503 until then): wait for a served request
        probe = json.dumps({"text": "probe", "sampling_params": {"max_new_tokens": 1}}).encode()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                req = urllib.request.Request(self.url + "/generate", data=probe,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    if r.status == 200:
                        return self
            except Exception:
                time.sleep(1.0)
        raise TimeoutError(f"router serves nothing:\n{self.log_path.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


@pytest.fixture(scope="module")
def replicas(models, log_dir):
    pytest.importorskip("sglang_router")
    servers = [Server(f"replica{i}", dspark_args(models.bigram, models.noisy_drafter, "fixed:3", "--enable-metrics"),
                      None, log_dir) for i in range(2)]
    started = []
    try:
        for s in servers:
            started.append(s.start())
        yield started
    finally:
        for s in started:
            s.stop()


def test_two_replicas_behind_the_router_both_serve_and_are_scraped(replicas, log_dir, tmp_path):
    with Router([s.url for s in replicas], log_dir) as router:
        def one(i: int) -> int:
            return len(post_json(router.url + "/generate", {"text": f"request {i}:", "sampling_params": {
                "max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}}, timeout=600)["output_ids"])

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(one, range(32))) == [8] * 32
        served = [_metric(s.url, "sglang:dspark_verify_steps_total") for s in replicas]
        assert all(v > 0 for v in served), f"a replica served nothing through the router: {served}"

        binary = prometheus_binary()
        port = _free_port()
        cfg = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
            {"job_name": "sglang", "static_configs": [{"targets": [s.url[len("http://"):] for s in replicas]}]},
            {"job_name": "router", "static_configs": [{"targets": [f"127.0.0.1:{router.metrics_port}"]}]}]}
        (tmp_path / "prom.yml").write_text(json.dumps(cfg))
        proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'prom.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            base, deadline, found = f"http://127.0.0.1:{port}", time.monotonic() + 90, set()
            while time.monotonic() < deadline and len(found) < 2:
                time.sleep(2)
                try:
                    res = prom_query(base, 'count by (instance) ({__name__=~"sglang(:|_)dspark_.*"})')
                except Exception:
                    continue
                found = {r["metric"]["instance"] for r in res}
            assert found == {s.url[len("http://"):] for s in replicas}, found
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)


def test_dp_size_2_in_one_server_serves(models, log_dir):
    args = dspark_args(models.bigram, models.noisy_drafter, "fixed:3", "--dp-size", "2")
    with Server("dp2", args, None, log_dir) as srv:
        out = post_json(srv.url + "/generate", {"text": [f"x{i}" for i in range(6)], "sampling_params": {
            "max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}})
        assert [len(o["output_ids"]) for o in out] == [8] * 6
        assert all(o["meta_info"].get("dspark") is not None for o in out)
