"""Real SGLang 0.5.23 server on CPU, on a tiny random model: OpenAI API, greedy
equality with HF transformers, parameter validation, and NGRAM speculative decoding
(intel_amx backend on the patches/sgl_kernel stand-in).

Needs the venv prepared by scripts/apply_patches.py. One server at a time.
Run: .venv/bin/pytest -m integration tests/integration/test_cpu_sglang_smoke.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_server import SGLangServer  # noqa: E402
from tiny_model import build_tiny_model  # noqa: E402

PROMPTS = ["def foo(x):", "Hello, world! How are"]
MAX_TOKENS = 16
# ignore_eos: random weights may hit eos early; return_token_ids: compare ids, not text.
EXTRA = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", dtype="float32", arch="llama")


@pytest.fixture(scope="module")
def hf_model(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model)


def hf_greedy(hf_model, prompt_ids: list[int], n: int) -> list[int]:
    model, tok = hf_model
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id
        )
    return out[0, len(prompt_ids) :].tolist()


def completions(client, model: Path) -> list[dict]:
    results = []
    for prompt in PROMPTS:
        resp = client.completions.create(model=str(model), prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body=EXTRA)
        results.append(resp.model_dump()["choices"][0])
    return results


@pytest.fixture(scope="module")
def plain_server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "plain_server.log"
    args = ["--model-path", str(tiny_model), "--dtype", "float32", "--attention-backend", "torch_native"]
    with SGLangServer(args, log_path=log) as server:
        yield server


@pytest.fixture(scope="module")
def plain_results(plain_server, tiny_model):
    client = openai.OpenAI(base_url=plain_server.url + "/v1", api_key="none")
    return completions(client, tiny_model)


def test_completions_greedy_equal_hf(plain_results, hf_model):
    _, tok = hf_model
    for prompt, choice in zip(PROMPTS, plain_results):
        assert choice["prompt_token_ids"] == tok(prompt)["input_ids"]
        assert len(choice["token_ids"]) == MAX_TOKENS
        assert choice["token_ids"] == hf_greedy(hf_model, choice["prompt_token_ids"], MAX_TOKENS)
        assert choice["text"] == tok.decode(choice["token_ids"])


def test_chat_completions_greedy_equal_hf(plain_server, tiny_model, hf_model):
    _, tok = hf_model
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    client = openai.OpenAI(base_url=plain_server.url + "/v1", api_key="none")
    resp = client.chat.completions.create(
        model=str(tiny_model), messages=messages, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={**EXTRA, "return_prompt_token_ids": True},
    ).model_dump()
    choice = resp["choices"][0]
    prompt_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert choice["prompt_token_ids"] == tok(prompt_ids, add_special_tokens=False)["input_ids"]
    assert choice["message"]["role"] == "assistant"
    assert choice["response_token_ids"] == hf_greedy(hf_model, choice["prompt_token_ids"], MAX_TOKENS)
    assert choice["message"]["content"] == tok.decode(choice["response_token_ids"])


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_p": 2.0}])
def test_invalid_sampling_params_are_http_400(plain_server, tiny_model, bad):
    client = openai.OpenAI(base_url=plain_server.url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=str(tiny_model), prompt="hi", max_tokens=4, **bad)
    assert err.value.status_code == 400


def test_ngram_spec_greedy_equals_plain(plain_results, plain_server, tiny_model, tmp_path):
    plain_server.stop()  # one server at a time on this 2-core machine
    trace = tmp_path / "sgl_kernel_calls.txt"
    args = [
        "--model-path", str(tiny_model), "--dtype", "float32",
        "--attention-backend", "intel_amx", "--speculative-algorithm", "NGRAM",
        "--speculative-num-draft-tokens", "4",
    ]  # fmt: skip
    env = {"SGL_KERNEL_STANDIN_TRACE": str(trace)}
    with SGLangServer(args, env=env, log_path=tmp_path / "ngram_server.log") as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        spec_results = completions(client, tiny_model)
        log = server.log_text()
    assert "keeping the intel_amx attention backend" in log  # patches/sglang_keep_amx_backend.diff is live
    for plain, spec in zip(plain_results, spec_results):
        assert spec["token_ids"] == plain["token_ids"]
    called = {line.split()[1] for line in trace.read_text().splitlines()}
    print("sgl_kernel stand-in ops called on the NGRAM path:", sorted(called))
    assert {"extend_attention", "reconstruct_indices_from_tree_mask", "verify_tree_greedy_cpu"} <= called
