"""Every documented way to switch speculation through `python -m sglang_dspark.launch_server`, each on a real server
with a real `openai` client request:

  --no-dspark                      SGLang's plain decoding (`make serve-nospec`)
  --speculative-algorithm NONE     the same (SGLang 0.5.23 itself dies on the first request with it)
  --speculative-algorithm NGRAM    SGLang's own NGRAM, nothing of DSPARK_EXT added (peers through one launcher)
  default (no algorithm flag)      DSPARK_EXT, and per request custom_params dspark_max_verify = 0 turns it off
  --speculative-algorithm DSPARK   SGLang's builtin, CUDA/NPU/XPU only: refused in one line; so is a name SGLang
                                   does not know, after SGLang's own argument check

The servers are given only what a user would give (model, dtype, a small KV pool, no warmup): device, attention
backend, algorithm and drafter are the launcher's choice, which is what is under test. One server at a time (each
class stops its own); greedy text is compared against the --no-dspark server's where that one ran first.
`--speculative-algorithm DSPARK_EXT` builds the same SGLang argv as the default (tests/unit/test_launcher.py), so
it gets no server of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import requests

from tests.integration.conftest import REPO, SERVER_ENV, Server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

openai = pytest.importorskip("openai")

MAX_TOKENS = 12
PROMPT = "def add(a, b):"
# What a user passes; no --device / --attention-backend / --speculative-*: the launcher fills those in.
USER_ARGS = ["--dtype", "float32", "--max-total-tokens", "8192", "--skip-server-warmup", "--log-level", "info"]

PLAIN_TEXT: dict[str, str] = {}  # greedy completion of the --no-dspark server, once it ran


def _server(models, log_dir, name: str, *flags: str):
    srv = Server(f"launcher_{name}", ["--model-path", str(models.tiny), *USER_ARGS, *flags], None, log_dir)
    with srv:
        yield srv


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def _complete(server, **extra_body) -> "openai.types.Completion":
    client = _client(server)
    resp = client.completions.create(model=client.models.list().data[0].id, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                     temperature=0, extra_body={"ignore_eos": True, **extra_body})
    assert isinstance(resp, openai.types.Completion)  # the client raises on anything but a 2xx
    assert resp.choices[0].text and resp.usage.completion_tokens == MAX_TOKENS, resp
    return resp


def _chat(server) -> "openai.types.chat.ChatCompletion":
    client = _client(server)
    resp = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=MAX_TOKENS,
                                          temperature=0, messages=[{"role": "user", "content": "What is 1 2 3?"}],
                                          extra_body={"ignore_eos": True})
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content, resp
    assert resp.usage.completion_tokens == MAX_TOKENS, resp
    return resp


def _meta(server, **sampling) -> dict:
    r = requests.post(server.url + "/generate", timeout=300, json={
        "text": PROMPT, "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                                            **sampling}})
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _server_info(server) -> dict:
    r = requests.get(server.url + "/server_info", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _healthy(server) -> None:
    assert server.alive(), server.log_tail()
    assert requests.get(server.url + "/health", timeout=60).status_code == 200, server.log_tail()


def _check_plain(server) -> str:
    """Requests succeed, the server stays up, and nothing speculated: no algorithm, no SGLang spec counters, no
    DSPARK_EXT record, no spec log line. Returns the greedy completion."""
    resp = _complete(server)
    chat = _chat(server)
    for r in (resp, chat):
        assert "dspark" not in (r.model_extra or {}), r.model_extra
    meta = _meta(server)
    assert meta["completion_tokens"] == MAX_TOKENS
    assert not [k for k in meta if k.startswith("spec_")] and "dspark" not in meta, meta
    info = _server_info(server)
    assert info.get("speculative_algorithm") is None, info.get("speculative_algorithm")
    assert info.get("speculative_draft_model_path") is None
    assert info.get("attention_backend") == "torch_native"
    _healthy(server)
    assert "accept len" not in server.log_text()  # SGLang's decode log line under speculation
    return resp.choices[0].text


def _idle_cpu_share(server, seconds: float = 4.0) -> float:
    """Cores the server's processes used while no request was in (SGLang's scheduler busy-polls without
    --sleep-on-idle, which the launcher adds on CPU)."""
    time.sleep(1.0)  # let the last request's detokenize / log work settle
    before, t0 = server.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    return (server.cpu_seconds() - before) / (time.monotonic() - t0)


def _same_as_plain(text: str) -> None:
    if "no_dspark" in PLAIN_TEXT:
        assert text == PLAIN_TEXT["no_dspark"], (text, PLAIN_TEXT["no_dspark"])


# Class scope: each server lives for its class's tests only, so one runs at a time.
@pytest.fixture(scope="class")
def no_dspark_server(models, log_dir):
    yield from _server(models, log_dir, "no_dspark", "--no-dspark")


@pytest.fixture(scope="class")
def none_server(models, log_dir):
    yield from _server(models, log_dir, "algo_none", "--speculative-algorithm", "NONE")


@pytest.fixture(scope="class")
def ngram_server(models, log_dir):
    # NGRAM's corpus is a C++ extension SGLang JIT-compiles at the first start (~1 min, cached afterwards)
    yield from _server(models, log_dir, "algo_ngram", "--speculative-algorithm", "NGRAM",
                       "--speculative-num-draft-tokens", "4")


@pytest.fixture(scope="class")
def default_server(models, log_dir):
    """No --speculative-algorithm: DSPARK_EXT with the drafter named (the shipped one when none is). fixed:2 so
    every step verifies; --dspark-no-profile so no start-up profiling load competes with the test's requests."""
    yield from _server(models, log_dir, "default", "--speculative-draft-model-path", str(models.tiny_drafter),
                       "--dspark-controller", "fixed:2", "--dspark-no-profile")


class TestNoDspark:
    def test_plain_decoding(self, no_dspark_server):
        PLAIN_TEXT["no_dspark"] = _check_plain(no_dspark_server)

    def test_idle_server_sleeps(self, no_dspark_server):
        share = _idle_cpu_share(no_dspark_server)
        assert share < 0.25, f"an idle plain server used {share:.2f} cores"


class TestAlgorithmNone:
    def test_plain_decoding_like_no_dspark(self, none_server):
        _same_as_plain(_check_plain(none_server))
        assert "IndexError" not in none_server.log_text()


class TestAlgorithmNgram:
    def test_sglang_ngram_speculates_without_dspark_ext(self, ngram_server):
        server = ngram_server
        resp = _complete(server)
        assert "dspark" not in (resp.model_extra or {}), resp.model_extra
        _same_as_plain(resp.choices[0].text)  # greedy NGRAM is lossless
        meta = _meta(server)
        assert meta.get("spec_verify_ct", 0) > 0, meta  # SGLang's NGRAM worker verified drafts
        assert "dspark" not in meta, meta
        info = _server_info(server)
        assert info.get("speculative_algorithm") == "NGRAM"
        assert info.get("speculative_draft_model_path") is None  # the shipped DSpark drafter was not injected
        assert info.get("attention_backend") == "intel_amx"  # the launcher's pick: torch_native cannot verify
        _healthy(server)
        log = server.log_text()
        assert "keeping the intel_amx attention backend" in log  # patches/sglang_keep_amx_backend.diff
        assert "DSPARK_EXT" not in log


class TestDefaultDsparkExt:
    def test_dspark_ext_speculates(self, default_server, models):
        server = default_server
        resp = _complete(server)
        rec = (resp.model_extra or {}).get("dspark")
        assert isinstance(rec, dict) and rec["verify_steps"] > 0 and rec["verified"] > 0, rec
        _same_as_plain(resp.choices[0].text)  # greedy DSPARK_EXT is lossless in fp32
        info = _server_info(server)
        assert info.get("speculative_algorithm") == "DSPARK_EXT"
        assert info.get("speculative_draft_model_path") == str(models.tiny_drafter)
        _healthy(server)

    def test_dspark_max_verify_zero_turns_it_off_per_request(self, default_server):
        server = default_server
        resp = _complete(server, custom_params={"dspark_max_verify": 0})
        rec = (resp.model_extra or {}).get("dspark")
        assert isinstance(rec, dict) and rec["verified"] == 0 and rec["draft_steps"] == 0, rec
        _same_as_plain(resp.choices[0].text)
        _healthy(server)

    def test_idle_server_sleeps(self, default_server):
        share = _idle_cpu_share(default_server)
        assert share < 0.25, f"an idle DSPARK_EXT server used {share:.2f} cores"


def _launch_expecting_refusal(models, *flags: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, **SERVER_ENV}
    return subprocess.run([sys.executable, "-m", "sglang_dspark.launch_server", "--model-path", str(models.tiny),
                           *USER_ARGS, *flags], capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO)


@pytest.mark.parametrize("flags,needles", [
    (("--speculative-algorithm", "DSPARK"), ("cannot run on this CPU", "DSPARK_EXT")),  # before SGLang loads
    (("--speculative-algorithm", "EAGEL"), ("SGLang refused the server arguments",
                                              "Unknown speculative algorithm name: EAGEL")),  # SGLang's own check
])
def test_algorithm_that_cannot_run_is_a_one_line_error(models, flags, needles):
    r = _launch_expecting_refusal(models, *flags)
    assert r.returncode not in (0, None), r.stderr[-3000:]
    last = [l for l in r.stderr.splitlines() if l.strip()][-1]
    assert last.startswith("sglang_dspark:"), r.stderr[-3000:]
    for needle in needles:
        assert needle in last, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
