"""Structured outputs (JSON schema, regex, EBNF) with DSPARK_EXT: lossless, speculating, per request.

Servers (tiny fp32 target, random drafter): no speculation; DSPARK_EXT `fixed:4` without draft skipping (every
free request is drafted for and asks to verify 4 drafts every step; grammar requests take their drafts from their
grammar and prompt, the default --dspark-grammar-drafts copy, so each walk decides what they verify); the same in
bf16 with the drafter drafting grammar requests too (--dspark-grammar-drafts model). The T=1 test runs a bigram
target + noisy drafter `random:4` server in model mode.
Compact JSON (--constrained-json-disable-any-whitespace) keeps a random model's JSON output short, so it finishes.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch

from tests.integration.conftest import COMMON_ARGS, Server, dspark_args, generate, plain_args, post_json, prompts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

JSON_FLAGS = ["--constrained-json-disable-any-whitespace", "--enable-custom-logit-processor"]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok", "size"],
          "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                         "size": {"enum": ["small", "medium", "large"]}}}
REGEX = r"(yes|no), [0-9]{1,3}\."
EBNF = 'root ::= "The colour is " colour "."\ncolour ::= "red" | "green" | "blue"'
GRAMMARS = {"json_schema": json.dumps(SCHEMA), "regex": REGEX, "ebnf": EBNF}
TOKENS = 48


def _valid(kind: str, text: str) -> bool:
    if kind == "json_schema":
        try:
            obj = json.loads(text, strict=False)  # a random model writes raw control characters
        except ValueError:
            return False
        return (set(obj) == {"name", "ok", "size"} and isinstance(obj["name"], str) and len(obj["name"]) <= 6
                and isinstance(obj["ok"], bool) and obj["size"] in ("small", "medium", "large"))
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    return re.fullmatch(r"The colour is (red|green|blue)\.", text) is not None


def _grammar_batch(n_per_kind: int = 3):
    texts, params, kinds = [], [], []
    pool = prompts(n_per_kind * len(GRAMMARS))
    for kind, spec in GRAMMARS.items():
        for _ in range(n_per_kind):
            texts.append(pool[len(texts)])
            params.append({"max_new_tokens": TOKENS, "temperature": 0.0, kind: spec})
            kinds.append(kind)
    return texts, params, kinds


MIXED_TEXTS = prompts(4)
MIXED_PARAMS = [{"max_new_tokens": 24, "temperature": 0.0, "regex": REGEX}] + \
               [{"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}] * 3


BANNED = list(range(8, 1000))  # about half the tiny vocabulary: greedy output without the processor would use them


def _processor_batch():
    """1 request whose custom logit processor bans BANNED, then 3 free requests."""
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    first = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True,
             "custom_params": {"token_ids": BANNED}}
    body = {"text": MIXED_TEXTS, "sampling_params": [first] + MIXED_PARAMS[1:],
            "custom_logit_processor": [DisallowedTokensLogitsProcessor.to_str()] + [None] * 3}
    return body


def _chat_json(server: Server, i: int) -> tuple[int, str]:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    resp = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": f"Describe item {i} as JSON."}], temperature=0,
        max_tokens=TOKENS, response_format={"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}})
    return 200, resp.choices[0].message.content


def _json_requests(server: Server) -> dict:
    """20 JSON-schema chat requests: 10 one after another, then 10 four at a time."""
    seq = [_chat_json(server, i) for i in range(10)]
    with ThreadPoolExecutor(4) as pool:
        conc = list(pool.map(lambda i: _chat_json(server, i), range(10, 20)))
    return {"sequential": seq, "concurrent": conc}


def _bad_requests(server: Server) -> list[int]:
    """Status codes of an invalid JSON schema, an invalid regex and an invalid EBNF, then /health."""
    codes = []
    for key, spec in (("json_schema", '{"type": "object", "properties": 7}'), ("regex", "(unclosed"),
                      ("ebnf", "root ::= ")):
        r = requests.post(server.url + "/generate", json={"text": "x", "sampling_params": {
            "max_new_tokens": 4, key: spec}}, timeout=120)
        codes.append(r.status_code)
    codes.append(requests.get(server.url + "/health", timeout=30).status_code)
    return codes


def _run(server: Server) -> dict:
    with server:
        texts, params, kinds = _grammar_batch()
        return {"grammar": generate(server, texts, params), "kinds": kinds,
                "mixed": generate(server, MIXED_TEXTS, MIXED_PARAMS), "json": _json_requests(server),
                "processor": post_json(server.url + "/generate", _processor_batch()),
                "bad": _bad_requests(server)}


def _bf16(args: list[str]) -> list[str]:
    i = args.index("--dtype")
    return args[:i + 1] + ["bfloat16"] + args[i + 2:]


@pytest.fixture(scope="module")
def runs(models, log_dir) -> dict:
    t = models.tiny
    jobs = {
        "plain": plain_args(t) + JSON_FLAGS,
        "dspark": dspark_args(t, models.tiny_drafter, "fixed:4", "--dspark-no-draft-skip", *JSON_FLAGS),
        # the drafter drafts grammar requests too (its forbidden tokens replaced by its best allowed ones)
        "dspark_bf16": _bf16(dspark_args(t, models.tiny_drafter, "fixed:4", "--dspark-no-draft-skip",
                                         "--dspark-grammar-drafts", "model", *JSON_FLAGS)),
    }
    assert "--dtype" in COMMON_ARGS
    servers = {name: Server(f"structured_{name}", args, None, log_dir) for name, args in jobs.items()}
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_run, srv) for name, srv in servers.items()}
        return {name: f.result() for name, f in futures.items()}


def test_grammar_outputs_are_token_identical_to_no_speculation_and_valid(runs):
    kinds = runs["plain"]["kinds"]
    for i, (s, p) in enumerate(zip(runs["dspark"]["grammar"], runs["plain"]["grammar"])):
        assert s["output_ids"] == p["output_ids"], (kinds[i], s["text"], p["text"])
        assert _valid(kinds[i], s["text"]), (kinds[i], s["text"])
    recs = [o["meta_info"]["dspark"] for o in runs["dspark"]["grammar"]]
    print("grammar requests", [(k, r["verified"], r["accepted"]) for k, r in zip(kinds, recs)])
    for kind in GRAMMARS:
        assert sum(r["verified"] for k, r in zip(kinds, recs) if k == kind) > 0, f"{kind}: nothing verified"


def test_bf16_grammar_outputs_are_valid_with_model_drafts(runs):
    kinds = runs["dspark_bf16"]["kinds"]
    for kind, o in zip(kinds, runs["dspark_bf16"]["grammar"]):
        assert _valid(kind, o["text"]), (kind, o["text"])
    recs = [o["meta_info"]["dspark"] for o in runs["dspark_bf16"]["grammar"]]
    assert all(r["draft_steps"] > 0 for r in recs), recs  # the drafter ran for the grammar requests


@pytest.mark.parametrize("name", ["plain", "dspark", "dspark_bf16"])
def test_json_schema_chat_requests_all_succeed_with_valid_json(runs, name):
    """The regression: a verify step committed a bonus token the grammar forbids (HTTP 500, 'Grammar accept_token
    failed'), because verify rows were never masked."""
    for mode, results in runs[name]["json"].items():
        assert len(results) == 10
        for status, content in results:
            assert status == 200 and _valid("json_schema", content), (mode, content)


def test_a_grammar_request_does_not_stop_its_batch_mates_speculating(runs):
    out = runs["dspark"]["mixed"]
    recs = [o["meta_info"]["dspark"] for o in out]
    print("mixed batch", [(r["verified"], r["accepted"]) for r in recs])
    assert _valid("regex", out[0]["text"]), out[0]["text"]
    assert all(r["verified"] > 0 for r in recs), recs
    ref = runs["plain"]["mixed"]
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]


def test_a_custom_logit_processor_applies_to_its_request_only_and_batch_mates_keep_speculating(runs):
    out, ref = runs["dspark"]["processor"], runs["plain"]["processor"]
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in ref]
    assert not set(out[0]["output_ids"]) & set(BANNED), "the processor's ban did not hold under speculation"
    assert set(out[1]["output_ids"]) & set(BANNED), "control: unprocessed greedy output uses banned ids"
    recs = [o["meta_info"]["dspark"] for o in out]
    print("processor batch", [(r["verified"], r["accepted"]) for r in recs])
    assert recs[0]["verified"] == 0 and all(r["verified"] > 0 for r in recs[1:]), recs


@pytest.mark.parametrize("name", ["plain", "dspark"])
def test_invalid_grammars_get_http_400_and_the_server_stays_healthy(runs, name):
    assert runs[name]["bad"] == [400, 400, 400, 200]


# ---------------------------------------------------------------------------------------------- T = 1 under a regex
T1_SAMPLES = 3000
T1_PROMPT = "Hello, world! How"


def _regex_law(models, alphabet: list[int]):
    """Exact law of the first 3 tokens under regex (a1|a2|a3|a4)+ at T = 1: each step is the bigram softmax
    restricted to the tokens the grammar allows after the prefix (walked with SGLang's xgrammar backend on the
    same tokenizer), over the cells alphabet^3; everything else is the pooled remainder."""
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from transformers import AutoTokenizer

    from sglang_dspark.sglang_plugin.grammar import allowed_ids
    from tests.tiny_dspark import bigram_logits

    tok = AutoTokenizer.from_pretrained(models.bigram)
    V = json.loads((models.bigram / "config.json").read_text())["vocab_size"]
    backend = XGrammarGrammarBackend(tok, vocab_size=V, model_eos_token_ids=[tok.eos_token_id or 0])
    pieces = [tok.decode([t]) for t in alphabet]
    regex = "(" + "|".join(re.escape(p) for p in pieces) + ")+"
    g = backend.dispatch_regex(regex)
    logits = bigram_logits(models.bigram)
    x0 = tok(T1_PROMPT)["input_ids"][-1]
    mask = g.allocate_vocab_mask(vocab_size=V, batch_size=1, device="cpu")
    K = len(alphabet)
    cells = np.zeros(K ** 3)

    def step(prev: int) -> torch.Tensor:
        g.fill_vocab_mask(mask, 0)
        ok = torch.from_numpy(allowed_ids(mask[0], V))
        p = torch.zeros(V, dtype=torch.float64)
        p[ok] = torch.softmax(logits[prev][ok], -1)
        return p

    p1 = step(x0)
    for i, a in enumerate(alphabet):
        g.accept_token(a)
        p2 = step(a)
        for j, b in enumerate(alphabet):
            g.accept_token(b)
            p3 = step(b)
            for k, c in enumerate(alphabet):
                cells[(i * K + j) * K + k] = float(p1[a] * p2[b] * p3[c])
            g.rollback(1)
        g.rollback(1)
    return regex, cells


@pytest.fixture(scope="module")
def bigram_model_drafts_server(models, log_dir):
    """Bigram + noisy drafter, random:4, and the drafter drafting grammar requests too: the regex alphabet gives no
    jump-forward text and the prompt no lookup, so sampled-target verification under the mask sees real drafts."""
    srv = Server("bigram_grammar_model_drafts", dspark_args(models.bigram, models.noisy_drafter, "random:4",
                                                            "--dspark-grammar-drafts", "model"), None, log_dir)
    with srv:
        yield srv


def test_t1_samples_under_a_regex_follow_the_grammar_constrained_law(models, bigram_model_drafts_server):
    from tests.integration.test_dspark_lossless_sampling import LAW_ALPHA, ExactLaw, check

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models.bigram)
    # four support tokens whose text is plain (no byte fallback pieces) and none a prefix of another
    cands = [t for t in models.support
             if tok.decode([t]).strip() and tok.decode([t]).isprintable() and "\ufffd" not in tok.decode([t])]
    alphabet = []
    for t in cands:
        s = tok.decode([t])
        if all(not (s.startswith(tok.decode([u])) or tok.decode([u]).startswith(s)) for u in alphabet):
            alphabet.append(t)
        if len(alphabet) == 4:
            break
    assert len(alphabet) == 4, [tok.decode([t]) for t in cands]
    regex, cells = _regex_law(models, alphabet)
    law = ExactLaw.__new__(ExactLaw)
    law.support, law.index, law.cells = alphabet, {x: i for i, x in enumerate(alphabet)}, cells
    sampling = {"max_new_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "regex": regex}
    outs = []
    for _ in range(T1_SAMPLES // 500):
        outs += generate(bigram_model_drafts_server, [T1_PROMPT] * 500, sampling)
    ids = np.array([law.cell(o["output_ids"]) if len(o["output_ids"]) == 3 else -1 for o in outs])
    res = check(law, ids)
    recs = [o["meta_info"].get("dspark") for o in outs]
    verified = sum(r["verified"] for r in recs if r)
    accepted = sum(r["accepted"] for r in recs if r)
    print("T=1 regex", regex, res, "verified", verified, "accepted", accepted)
    assert res["kept_mass"] > 0.8, res
    assert verified > 0 and accepted > 0, "drafts must be verified (and some accepted) under the grammar"
    assert res["p"] > LAW_ALPHA and res["tv"] < res["tv_bound"], res
    # power: the same samples against the law without the grammar (support outside the alphabet) must fail
    free = ExactLaw(torch.softmax(_bigram(models), -1), torch.softmax(_bigram(models)[tok(T1_PROMPT)["input_ids"][-1]],
                                                                      -1), alphabet)
    assert check(free, ids)["p"] < 1e-6


def _bigram(models):
    from tests.tiny_dspark import bigram_logits

    return bigram_logits(models.bigram)
