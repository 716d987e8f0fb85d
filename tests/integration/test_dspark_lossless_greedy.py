"""Greedy losslessness of DSPARK_EXT (fp32): speculation must give token-identical output to the no-spec server.

Runs (each a server; two at a time to save wall time; each run: start, query, stop):
  tiny target (random weights, real attention) + random drafter: controllers `fixed:3`, `random:4` (uniform
    ragged verify lengths) and `fixed:0` (every step takes the plain-decode fast path). The `fixed:3` run starts
    with SGLANG_DSPARK_INJECT_NAN_STEPS=3 and its FIRST request is a lone one: its first 3 decode steps must fall
    back to plain decoding (test 4) and still be lossless.
  bigram target + matching drafter: noise 0 under `fixed:4` (every draft right: tau > 2) and noise 0.5 under
    `dspark` (partial acceptance); compared to the no-spec server AND to the exact float64 bigram argmax chain.
All prompts of a run go in one /generate call with per-prompt max_new_tokens, so the running batch mixes verify
lengths and shrinks as requests finish at different steps.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.conftest import (GREEDY_TOKENS, NUM_PROMPTS, Server, dspark_args, generate, plain_args,
                                        post_json, prompts)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

NAN_STEPS = 3
PROMPTS = prompts(NUM_PROMPTS)
# Different lengths: requests leave the batch at different steps (exercises filter_batch of the draft state).
MAX_NEW = [max(4, GREEDY_TOKENS - 3 * (i % 5)) for i in range(NUM_PROMPTS)]


def _greedy(n: int) -> dict:
    return {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}


LOGPROB_PROMPTS = PROMPTS[:6]


def _run(server: Server, probe: bool, logprobs: bool = False) -> dict:
    with server:
        res = {"start_s": server.start_s}
        if probe:  # must be the very first request the server sees (the NaN steps count from server start)
            res["probe"] = generate(server, [PROMPTS[0]], _greedy(GREEDY_TOKENS))[0]
        res["batch"] = generate(server, PROMPTS, [_greedy(n) for n in MAX_NEW])
        if logprobs:
            res["logprobs"] = post_json(server.url + "/generate", {
                "text": LOGPROB_PROMPTS, "sampling_params": _greedy(GREEDY_TOKENS), "return_logprob": True,
                "top_logprobs_num": 2})
        return res


@pytest.fixture(scope="module")
def runs(models, log_dir) -> dict:
    t, b = models.tiny, models.bigram
    jobs = {
        "tiny_plain": (plain_args(t), None),
        # no draft skipping here: the NaN accounting (draft_steps == verify_steps - 3) must be exact
        "tiny_dspark_nan": (dspark_args(t, models.tiny_drafter, "fixed:3", "--dspark-no-draft-skip"),
                            {"SGLANG_DSPARK_INJECT_NAN_STEPS": str(NAN_STEPS)}),
        "tiny_random4": (dspark_args(t, models.tiny_drafter, "random:4"), None),
        # every step verifies nothing: the plain-decode fast path for the whole run
        "tiny_fixed0": (dspark_args(t, models.tiny_drafter, "fixed:0", "--dspark-no-draft-skip"), None),
        "bigram_plain": (plain_args(b), None),
        "bigram_exact_fixed4": (dspark_args(b, models.exact_drafter, "fixed:4"), None),
        "bigram_noisy_dspark": (dspark_args(b, models.noisy_drafter, "dspark"), None),
    }
    servers = {name: Server(name, args, env, log_dir) for name, (args, env) in jobs.items()}
    pool = ThreadPoolExecutor(2)  # pairs in order: (tiny plain, dspark), (random4, bigram plain), ...
    try:
        futures = {name: pool.submit(_run, srv, probe=name == "tiny_dspark_nan",
                                     logprobs=name in ("tiny_plain", "tiny_random4", "tiny_fixed0", "bigram_plain",
                                                       "bigram_exact_fixed4"))
                   for name, srv in servers.items()}
        return {name: f.result() for name, f in futures.items()}
    finally:  # on a failure or ^C, do not start the remaining servers
        pool.shutdown(wait=True, cancel_futures=True)


def _ids(run: dict) -> list[list[int]]:
    return [r["output_ids"] for r in run["batch"]]


def _records(run: dict) -> list[dict]:
    recs = [r["meta_info"].get("dspark") for r in run["batch"]]
    assert all(rec is not None for rec in recs), "meta_info['dspark'] missing on a DSPARK_EXT server"
    return recs


def _assert_identical(spec: list[list[int]], ref: list[list[int]], what: str) -> None:
    assert len(spec) == len(ref)
    for i, (s, r) in enumerate(zip(spec, ref)):
        assert len(s) == MAX_NEW[i], f"{what}: prompt {i} got {len(s)} tokens, asked {MAX_NEW[i]}"
        if s != r:
            k = next(j for j, (a, b) in enumerate(zip(s, r)) if a != b)
            pytest.fail(f"{what}: prompt {i} ({PROMPTS[i]!r}) diverges at token {k}: spec {s[k:k + 6]} vs "
                        f"no-spec {r[k:k + 6]}")


def _totals(recs: list[dict]) -> dict:
    keys = ("verify_steps", "draft_steps", "verified", "accepted")
    return {k: sum(r[k] for r in recs) for k in keys}


@pytest.mark.parametrize("name", ["tiny_dspark_nan", "tiny_random4"])
def test_random_drafter_greedy_is_lossless(runs, name):
    _assert_identical(_ids(runs[name]), _ids(runs["tiny_plain"]), name)
    tot = _totals(_records(runs[name]))
    print(name, tot)
    assert tot["verified"] > 0, f"{name}: nothing was ever verified, so losslessness was not exercised: {tot}"
    for rec, n in zip(_records(runs[name]), MAX_NEW):
        # every step commits 1 target token + the accepted drafts; the prefill token is not a verify step
        assert rec["verify_steps"] + rec["accepted"] >= n - 1, rec


def test_plain_decode_fast_path_is_lossless(runs):
    """fixed:0 verifies nothing, so every decode step takes SGLang's plain decode forward (with feature capture).
    After 4 planned steps that verified nothing, only backed-off probe steps (4, 8, 16 ... apart) draft and plan;
    the rest decode plainly without a plan (PlainStreak). Draft skipping is off, so every planned step drafts."""
    _assert_identical(_ids(runs["tiny_fixed0"]), _ids(runs["tiny_plain"]), "tiny fixed:0 (plain-decode path)")
    for rec, n in zip(_records(runs["tiny_fixed0"]), MAX_NEW):
        assert rec["verified"] == 0 and rec["accepted"] == 0, rec
        assert rec["verify_steps"] == n - 1, rec  # one decode step per token after the prefill token
        assert 4 <= rec["draft_steps"] <= rec["verify_steps"], rec
        if n - 1 >= 12:  # planned steps 0-3, probes at 7 and 15 at the latest: at most 6 of the first 12
            assert rec["draft_steps"] < rec["verify_steps"], f"unplanned steps never happened: {rec}"


@pytest.mark.parametrize("name,plain_name", [("tiny_random4", "tiny_plain"), ("tiny_fixed0", "tiny_plain"),
                                             ("bigram_exact_fixed4", "bigram_plain")])
def test_logprobs_with_speculation_equal_plain_decoding(runs, name, plain_name):
    """return_logprob + top_logprobs_num work with DSPARK_EXT (SGLang's builtin DSPARK rejects them): every
    committed token - accepted draft (the exact bigram drafter's are all accepted), bonus, or plain-decode token -
    carries the target's logprob and top-2, as without speculation."""
    spec, plain = runs[name]["logprobs"], runs[plain_name]["logprobs"]
    for i, (s, p) in enumerate(zip(spec, plain)):
        assert s["output_ids"] == p["output_ids"], i
        ms, mp = s["meta_info"], p["meta_info"]
        assert len(ms["output_token_logprobs"]) == len(mp["output_token_logprobs"]) == GREEDY_TOKENS
        for k, (a, b) in enumerate(zip(ms["output_token_logprobs"], mp["output_token_logprobs"])):
            assert a[1] == b[1], (i, k)
            assert a[0] == pytest.approx(b[0], abs=1e-3), (i, k, a, b)
        for k, (a, b) in enumerate(zip(ms["output_top_logprobs"], mp["output_top_logprobs"])):
            assert [t[1] for t in a] == [t[1] for t in b], (i, k)
            assert [t[0] for t in a] == pytest.approx([t[0] for t in b], abs=1e-3), (i, k)
    if name == "bigram_exact_fixed4":
        assert sum(r["meta_info"]["dspark"]["accepted"] for r in spec) > 0


def test_random4_verify_lengths_are_ragged(runs):
    recs = _records(runs["tiny_random4"])
    means = {r["mean_verify_len"] for r in recs}
    assert 0.5 < sum(r["verified"] for r in recs) / sum(r["verify_steps"] for r in recs) < 3.5
    assert len(means) > 1, "random:4 gave every request the same mean verify length"


def test_exact_bigram_drafter_is_lossless_and_fully_accepted(runs, bigram_chain):
    spec = _ids(runs["bigram_exact_fixed4"])
    _assert_identical(spec, _ids(runs["bigram_plain"]), "bigram exact fixed:4 vs no-spec")
    _assert_identical(_ids(runs["bigram_plain"]), bigram_chain(), "no-spec vs exact chain")
    tot = _totals(_records(runs["bigram_exact_fixed4"]))
    tau = (tot["accepted"] + tot["verify_steps"]) / tot["verify_steps"]
    print("bigram exact fixed:4", tot, "tau", tau)
    assert tot["accepted"] == tot["verified"], f"a noise-0 matching drafter must have every draft accepted: {tot}"
    assert tau > 2.0, tot


def test_noisy_bigram_drafter_is_lossless_with_partial_acceptance(runs):
    _assert_identical(_ids(runs["bigram_noisy_dspark"]), _ids(runs["bigram_plain"]), "bigram noisy dspark")
    tot = _totals(_records(runs["bigram_noisy_dspark"]))
    print("bigram noisy dspark", tot)
    assert 0 < tot["accepted"] < tot["verified"], f"expected some but not all drafts accepted: {tot}"


def test_drafter_nan_falls_back_to_plain_decoding(runs):
    probe = runs["tiny_dspark_nan"]["probe"]
    plain = runs["tiny_plain"]["batch"][0]["output_ids"]
    assert probe["output_ids"][: len(plain)] == plain[: len(probe["output_ids"])]
    assert len(probe["output_ids"]) == GREEDY_TOKENS
    rec = probe["meta_info"]["dspark"]
    print("nan probe", rec)
    assert rec["draft_steps"] == rec["verify_steps"] - NAN_STEPS, rec


def test_draft_accounting_without_faults(runs):
    """fixed:4 never verifies 0, so draft skipping never applies: every verify step had a draft pass. With draft
    skipping on (random:4, dspark), a request may skip drafting, never the other way round."""
    for i, r in enumerate(_records(runs["bigram_exact_fixed4"])):
        assert r["draft_steps"] == r["verify_steps"], (i, r)
    for name in ("tiny_random4", "bigram_noisy_dspark"):
        for i, r in enumerate(_records(runs[name])):
            assert r["draft_steps"] <= r["verify_steps"], (name, i, r)


@pytest.fixture(scope="module")
def bigram_chain(models):
    """Exact greedy continuation of the bigram target (float64): x_{t+1} = argmax logits[x_t]; the first token is
    conditioned on the last prompt token. Asserts the argmax margins are not numerical ties."""
    from tests.tiny_dspark import bigram_logits

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models.bigram)
    logits = bigram_logits(models.bigram)
    top2 = logits.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]

    def chain() -> list[list[int]]:
        out = []
        for prompt, n in zip(PROMPTS, MAX_NEW):
            x = tok(prompt)["input_ids"][-1]
            seq = []
            for _ in range(n):
                assert margin[x] > 1e-4, f"bigram row {x} has a near-tie; the exact oracle is ill-posed"
                x = int(logits[x].argmax())
                seq.append(x)
            out.append(seq)
        return out

    return chain



@pytest.mark.parametrize("name", ["tiny_dspark_nan", "tiny_random4", "bigram_exact_fixed4"])
def test_verify_forwards_ran_chain_only_attention(runs, log_dir, name):
    """The lossless runs above exercised our chain-only verify attention (torch_native backend), not SGLang's."""
    log = (log_dir / f"{name}.log").read_text(errors="replace")
    assert "verify forwards use chain-only SDPA attention" in log, f"{name}: chain verify attention not installed"
