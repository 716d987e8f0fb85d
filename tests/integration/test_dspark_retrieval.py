"""Retrieval drafts (prompt/output lookup, cross-request corpus, n-gram table) on a real server.

Runs (greedy, fp32), each against the same target without speculation:
  - tiny target (random weights, real attention) with retrieval drafts forced on: no drafter pass at all
    (--dspark-no-model-drafts) and `fixed:4`, so every chain a source offers is verified;
  - bigram target, forced on the same way, and the default hybrid (noisy matching drafter + both retrieval sources,
    `dspark` controller): the bigram's greedy chain cycles, so lookup chains are accepted as well as rejected.
  A third bigram run adds an n-gram table whose chains are right after even tokens, wrong after odd ones.
  Token-identical output is required, and retrieval chains must have been verified (per-request `by_source`).
  bigram target at T = 1 with retrieval drafts forced on (`random:4`, no drafter, the same table): the corpus
  proposes what other requests sampled and the table its fixed guesses, point-mass drafts; the 3-token
  continuation law is checked as in test_dspark_lossless_sampling.py (chi-square + TV bound), and drafts must be
  both accepted and rejected.
A bad custom_params.dspark_retrieval is an HTTP 400 and the server stays up.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.conftest import Server, dspark_args, generate, plain_args
from tests.integration.test_dspark_lossless_sampling import LAW_ALPHA, build_laws, sample_and_check

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
openai = pytest.importorskip("openai")

PROMPTS = ["a b c a b c a b", "def f(x):\n    return x\ndef f(x):\n", "one two three one two", "1 2 3 4 1 2 3",
           "The quick brown fox. The quick brown", "x = [1, 2, 3]\ny = [1, 2,", "hello hello hello", "class A: pass"]
TOKENS = 40
RETRIEVAL_ONLY = ("--dspark-retrieval", "both", "--dspark-no-model-drafts")


def _greedy() -> dict:
    return {"max_new_tokens": TOKENS, "temperature": 0.0, "ignore_eos": True}


def _run(server: Server) -> list[dict]:
    with server:
        first = generate(server, PROMPTS[:4], _greedy())  # finished outputs reach the corpus for the next call
        return first + generate(server, PROMPTS[4:], _greedy())


@pytest.fixture(scope="module")
def bigram_table(models, tmp_path_factory) -> str:
    """An n-gram table for the bigram target: after every even token the target's greedy successor, after every odd
    one a wrong token, so its chains are both accepted and rejected."""
    from sglang_dspark.retrieval import NgramTable
    from tests.tiny_dspark import bigram_logits

    greedy = bigram_logits(models.bigram).argmax(-1).tolist()
    V = len(greedy)
    path = tmp_path_factory.mktemp("ngram") / "ngram_table.npz"
    NgramTable.build([[x, greedy[x] if x % 2 == 0 else (greedy[x] + 1) % V] for x in range(V)]).save(path)
    return str(path)


@pytest.fixture(scope="module")
def greedy_runs(models, bigram_table, log_dir) -> dict:
    t, b = models.tiny, models.bigram
    jobs = {
        "tiny_plain": plain_args(t),
        "tiny_retrieval_only": dspark_args(t, models.tiny_drafter, "fixed:4", *RETRIEVAL_ONLY),
        "bigram_plain": plain_args(b),
        "bigram_retrieval_only": dspark_args(b, models.noisy_drafter, "fixed:4", *RETRIEVAL_ONLY),
        "bigram_table": dspark_args(b, models.noisy_drafter, "fixed:4", *RETRIEVAL_ONLY,
                                    "--dspark-ngram-table", bigram_table),
        "bigram_hybrid": dspark_args(b, models.noisy_drafter, "dspark", "--dspark-retrieval", "both"),
    }
    servers = {name: Server(f"retrieval_{name}", args, None, log_dir) for name, args in jobs.items()}
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_run, srv) for name, srv in servers.items()}
        return {name: f.result() for name, f in futures.items()}


def _by_source(run: list[dict]) -> dict:
    total: dict = {}
    for r in run:
        for source, counts in (r["meta_info"]["dspark"].get("by_source") or {}).items():
            agg = total.setdefault(source, {"steps": 0, "verified": 0, "accepted": 0})
            for k in agg:
                agg[k] += counts[k]
    return total


@pytest.mark.parametrize("name", ["tiny_retrieval_only", "bigram_retrieval_only", "bigram_table", "bigram_hybrid"])
def test_greedy_with_retrieval_drafts_is_token_identical(greedy_runs, name):
    ref = [r["output_ids"] for r in greedy_runs[name.split("_")[0] + "_plain"]]
    got = [r["output_ids"] for r in greedy_runs[name]]
    for i, (g, r) in enumerate(zip(got, ref)):
        assert len(g) == TOKENS
        if g != r:
            k = next(j for j, (a, b) in enumerate(zip(g, r)) if a != b)
            pytest.fail(f"{name}: prompt {i} ({PROMPTS[i]!r}) diverges at token {k}: {g[k:k + 6]} vs {r[k:k + 6]}")
    sources = _by_source(greedy_runs[name])
    print(name, sources)
    retrieved = sum(sources.get(s, {}).get("verified", 0) for s in ("prompt", "corpus", "table"))
    if name == "bigram_hybrid":  # the matching drafter's calibrated block usually outbids untried chains here
        assert sum(v["verified"] for v in sources.values()) > 0, f"{name}: nothing was verified: {sources}"
        return
    assert retrieved > 0, f"{name}: no retrieval draft was verified, so the test exercised nothing: {sources}"
    accepted = sum(sources.get(s, {}).get("accepted", 0) for s in ("prompt", "corpus", "table"))
    if name.startswith("bigram"):  # the cycle is found: accepted chains (the tiny model's are rejected: both paths)
        assert accepted > 0, f"{name}: no retrieval draft was accepted: {sources}"
    else:
        assert accepted < retrieved, f"{name}: every retrieval draft was accepted: {sources}"


def test_table_chains_are_verified_accepted_and_rejected(greedy_runs):
    table = _by_source(greedy_runs["bigram_table"]).get("table", {})
    assert 0 < table.get("accepted", 0) < table.get("verified", 0), table


@pytest.mark.parametrize("name", ["tiny_retrieval_only", "bigram_retrieval_only", "bigram_table"])
def test_retrieval_only_runs_no_drafter_pass(greedy_runs, name):
    recs = [r["meta_info"]["dspark"] for r in greedy_runs[name]]
    assert sum(r["draft_steps"] for r in recs) == 0, recs
    assert "drafter" not in _by_source(greedy_runs[name])


def test_hybrid_uses_both_the_drafter_and_retrieval(greedy_runs):
    sources = _by_source(greedy_runs["bigram_hybrid"])
    assert sources.get("drafter", {}).get("verified", 0) > 0, sources


@pytest.fixture(scope="module")
def sampling_server(models, bigram_table, log_dir):
    srv = Server("retrieval_bigram_random4", dspark_args(models.bigram, models.noisy_drafter, "random:4",
                                                         "--dspark-record-verify-lens", *RETRIEVAL_ONLY,
                                                         "--dspark-ngram-table", bigram_table),
                 None, log_dir)
    with srv:
        yield srv


def test_t1_samples_with_retrieval_drafts_follow_the_exact_law(sampling_server, models):
    res, recs, verified, accepted, _ = sample_and_check(sampling_server, build_laws(models), None,
                                                        "T=1 retrieval drafts:")
    assert 0 < accepted < verified, "point-mass retrieval drafts must be both accepted and rejected here"
    assert sum(r["draft_steps"] for r in recs) == 0
    assert res["kept_mass"] > 0.8, res
    assert res["p"] > LAW_ALPHA, f"chi-square rejects the target law: {res}"
    assert res["tv"] < res["tv_bound"], f"TV distance above the sampling bound: {res}"


@pytest.mark.parametrize("bad", ["sometimes", 3, ""])
def test_bad_dspark_retrieval_is_http_400(sampling_server, bad):
    client = openai.OpenAI(base_url=sampling_server.url + "/v1", api_key="none", max_retries=0)
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model, prompt="hi", max_tokens=4,
                                  extra_body={"custom_params": {"dspark_retrieval": bad}})
    assert err.value.status_code == 400 and "dspark_retrieval" in str(err.value)
    ok = client.completions.create(model=model, prompt="hi", max_tokens=4,
                                   extra_body={"custom_params": {"dspark_retrieval": "prompt"}})
    assert ok.choices[0].text is not None and sampling_server.alive()
