"""DSPARK_EXT behind SGLang's OpenAI API: concurrent streams with mixed sampling, abort without a KV leak,
request validation, and the `dspark` response extension as standard clients see it.

Server: the shared bigram + noisy drafter + `random:4` + --dspark-record-verify-lens (shared with the T=1 test).
KV accounting: /v1/loads `num_used_tokens` = pool size - free - evictable (radix cache), republished by the
scheduler when it goes fully idle; SGLang's idle leak check (SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE, on by
default) would also crash the scheduler on a leak, which /health then shows.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import requests

from tests.integration.conftest import prompts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

openai = pytest.importorskip("openai")

ABORT_AFTER_CHUNKS = 4
# (max_tokens, sampling) per stream; the last one is closed mid-stream.
STREAMS = [
    (20, {"temperature": 0.0}),
    (24, {"temperature": 0.8, "top_p": 0.9}),
    (16, {"temperature": 1.0, "extra_body": {"top_k": 5}}),
    (28, {"temperature": 0.7, "extra_body": {"min_p": 0.1}}),
    (12, {"temperature": 1.0, "frequency_penalty": 0.5, "presence_penalty": 0.3}),
    (30, {"temperature": 0.9, "extra_body": {"repetition_penalty": 1.2}}),
    (18, {"temperature": 0.0, "frequency_penalty": 0.4}),
    (1500, {"temperature": 1.0}),
]


def _load(server) -> dict:
    r = requests.get(server.url + "/v1/loads", params={"include": "core"}, timeout=30)
    r.raise_for_status()
    return r.json()["loads"][0]


def _wait_idle(server, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        load = _load(server)
        if load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0:
            time.sleep(1.0)  # let the fully-idle publish (after the cache flush) land
            return _load(server)
        assert time.monotonic() < deadline, f"server still busy after {timeout_s}s: {load}"
        time.sleep(0.5)


def _model(client) -> str:
    return client.models.list().data[0].id


async def _streams(server) -> list[dict]:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    model = (await client.models.list()).data[0].id
    texts = prompts(len(STREAMS))

    async def one(i: int) -> dict:
        max_tokens, params = STREAMS[i]
        extra = {"ignore_eos": True, **params.get("extra_body", {})}
        kw = {k: v for k, v in params.items() if k != "extra_body"}
        stream = await client.completions.create(model=model, prompt=texts[i], max_tokens=max_tokens, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=extra, **kw)
        chunks, usage, finish = 0, None, None
        aborting = i == len(STREAMS) - 1
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if chunk.choices:
                chunks += 1
                finish = chunk.choices[0].finish_reason or finish
            if aborting and chunks >= ABORT_AFTER_CHUNKS:
                await stream.close()  # the client disconnects; SGLang must abort the request
                break
        return {"chunks": chunks, "usage": usage, "finish": finish}

    try:
        return await asyncio.gather(*(one(i) for i in range(len(STREAMS))))
    finally:
        await client.close()


def test_concurrent_streams_with_abort_leave_no_kv_leak(bigram_random4_server):
    server = bigram_random4_server
    before = _wait_idle(server)
    t0 = time.monotonic()
    results = asyncio.run(_streams(server))
    after = _wait_idle(server)
    print("KV before", before["num_used_tokens"], "after", after["num_used_tokens"],
          f"idle {time.monotonic() - t0:.1f}s after start", [r["usage"] for r in results])
    for (max_tokens, params), res in zip(STREAMS[:-1], results[:-1]):
        assert res["usage"] is not None, f"no usage chunk for {params}"
        assert res["usage"].completion_tokens == max_tokens, (params, res)
        assert res["finish"] == "length", (params, res)
    aborted = results[-1]
    assert aborted["chunks"] == ABORT_AFTER_CHUNKS and aborted["usage"] is None
    assert after["num_used_tokens"] == before["num_used_tokens"], f"KV leak: before {before}, after {after}"
    assert requests.get(server.url + "/health", timeout=30).status_code == 200
    assert server.alive(), "server died (SGLang's idle KV leak check raises in the scheduler)"
    # The server still serves correctly afterwards.
    out = requests.post(server.url + "/generate", json={"text": "Hello", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}, timeout=120).json()
    assert len(out["output_ids"]) == 8


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_p": 2.0}, {"max_tokens": -5}])
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_bad_sampling_params_are_http_400(bigram_random4_server, api, bad):
    client = openai.OpenAI(base_url=bigram_random4_server.url + "/v1", api_key="none", max_retries=0)
    kw = {"max_tokens": 4, **bad}
    with pytest.raises(openai.BadRequestError) as err:
        if api == "chat":
            client.chat.completions.create(model=_model(client), messages=[{"role": "user", "content": "hi"}], **kw)
        else:
            client.completions.create(model=_model(client), prompt="hi", **kw)
    assert err.value.status_code == 400
    assert bigram_random4_server.alive()


def _check_record(rec: dict, completion_tokens: int) -> None:
    assert set(rec) >= {"verify_steps", "draft_steps", "verified", "accepted", "wasted", "mean_tau",
                        "mean_verify_len", "verify_lens"}, rec
    assert rec["verified"] == sum(rec["verify_lens"]), rec
    assert rec["verify_steps"] == len(rec["verify_lens"]), rec
    assert all(0 <= v <= 4 for v in rec["verify_lens"]), rec
    assert 0 <= rec["accepted"] <= rec["verified"] and rec["wasted"] == rec["verified"] - rec["accepted"], rec
    # the prefill emits token 1; each verify step commits its accepted drafts + 1 (the last may be cut by max)
    assert rec["verify_steps"] + rec["accepted"] >= completion_tokens - 1 >= rec["verify_steps"], rec


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_openai_responses_carry_the_dspark_record(bigram_random4_server, api):
    client = openai.OpenAI(base_url=bigram_random4_server.url + "/v1", api_key="none", max_retries=0)
    kw = {"model": _model(client), "max_tokens": 24, "temperature": 0, "extra_body": {"ignore_eos": True}}
    if api == "chat":
        resp = client.chat.completions.create(messages=[{"role": "user", "content": "What is 1 2 3?"}], **kw)
        assert isinstance(resp, openai.types.chat.ChatCompletion)
        assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content
    else:
        resp = client.completions.create(prompt="def add(a, b):", **kw)
        assert isinstance(resp, openai.types.Completion)
        assert resp.choices[0].text
    assert resp.usage.completion_tokens == 24
    rec = (resp.model_extra or {}).get("dspark")
    assert isinstance(rec, dict), f"no dspark field in {resp.model_dump().keys()}"
    print(api, rec)
    _check_record(rec, resp.usage.completion_tokens)
    # the raw JSON has it at top level as well
    raw = requests.post(bigram_random4_server.url + "/v1/" + ("chat/completions" if api == "chat" else "completions"),
                        json={**{k: v for k, v in kw.items() if k != "extra_body"}, "ignore_eos": True,
                              **({"messages": [{"role": "user", "content": "hi"}]} if api == "chat"
                                 else {"prompt": "hi"})}, timeout=120).json()
    assert isinstance(raw.get("dspark"), dict), raw
