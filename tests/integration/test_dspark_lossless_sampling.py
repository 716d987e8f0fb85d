"""Losslessness at T=1: DSPARK_EXT samples must follow the target's exact distribution.

Target: the bigram model of conftest (every transition lands in a 12-token support S), so the exact law of the
3-token continuation (a, b, c) after a prompt ending in token x0 is p(a|x0) p(b|a) p(c|b), p(.|x) = softmax(
bigram_logits[x]) in float64. Token a comes from SGLang's own prefill sampler; b and c come from DSPARK_EXT steps
(noisy matching drafter, `random:4` controller, so each step verifies 0..4 drafts and the rejection-sampling
residual path is hit at every depth). Run three times: the default greedy drafts (point-mass q), drafts sampled at
T=1 (per request: custom_params dspark_draft_temperature = "request"), and no speculation for the requests
(dspark_max_verify = 0: the worker's own plain-decode sampler).

Statistic: chi-square over the cells of S^3 with expected count >= 5, every other sequence pooled into one cell
(p > LAW_ALPHA required), and total variation distance between the empirical and exact laws over the same cells,
below
   bound = 1/2 sum_i sqrt(p_i / N)      (>= E[TV] by Jensen: E|X_i - N p_i| <= sqrt(N p_i))
         + sqrt(ln(1/LAW_ALPHA) / (2 N)) (McDiarmid: TV moves by <= 1/N per sample; exceeded w.p. <= LAW_ALPHA).
LAW_ALPHA is 0.1%: server samples are unseeded, and the suite holds five such checks, so at 1% one CI run in ~20
failed on a correct server (chi-square p = 0.0087, 2026-12-05). Power is unaffected: the wrong laws below give
p < 1e-6.
The same statistic must REJECT samples drawn (in the test) from deliberately wrong laws: the target tempered to
T=1.1, and "accept every draft" (tokens 2-3 from the drafter's own Markov distribution).
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from tests.integration.conftest import NUM_SAMPLES, generate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PROMPT = "Hello, world! How"
CALL_SIZE = 1000  # prompts per /generate call
MIN_EXPECTED = 5.0
LAW_ALPHA = 1e-3  # false-alarm rate of each law check on a correct server


class ExactLaw:
    """Probabilities of 3-token continuations over the support cells, plus the pooled remainder."""

    def __init__(self, step: torch.Tensor, first: torch.Tensor, support: list[int]):
        s = torch.tensor(support)
        p1 = first[s]
        pss = step[s][:, s]
        cube = p1[:, None, None] * pss[:, :, None] * pss[None, :, :]
        self.support = support
        self.index = {x: i for i, x in enumerate(support)}
        self.cells = cube.flatten().numpy()  # cell id = (i*K + j)*K + k

    def cell(self, seq: list[int]) -> int:
        K = len(self.support)
        try:
            i, j, k = (self.index[t] for t in seq)
        except KeyError:
            return -1
        return (i * K + j) * K + k


def check(law: ExactLaw, cell_ids: np.ndarray) -> dict:
    """Chi-square and TV of observed cell ids (-1: outside S^3) against `law`."""
    n = len(cell_ids)
    expected_p = law.cells
    keep = np.flatnonzero(expected_p * n >= MIN_EXPECTED)
    p = np.append(expected_p[keep], 1.0 - expected_p[keep].sum())  # last: pooled remainder
    counts_all = np.bincount(cell_ids[cell_ids >= 0], minlength=len(expected_p))
    obs = np.append(counts_all[keep], n - counts_all[keep].sum())
    exp = p * n
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    from scipy.stats import chi2 as chi2_dist

    pval = float(chi2_dist.sf(chi2, df=len(p) - 1))
    tv = 0.5 * float(np.abs(obs / n - p).sum())
    bound = 0.5 * float(np.sqrt(p / n).sum()) + math.sqrt(math.log(1 / LAW_ALPHA) / (2 * n))
    return {"n": n, "cells": len(p), "kept_mass": float(p[:-1].sum()), "chi2": chi2, "p": pval, "tv": tv,
            "tv_bound": bound}


def build_laws(models) -> dict[str, ExactLaw]:
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from tests.tiny_dspark import bigram_logits

    logits = bigram_logits(models.bigram)
    x0 = AutoTokenizer.from_pretrained(models.bigram)(PROMPT)["input_ids"][-1]
    p = torch.softmax(logits, -1)
    hot = torch.softmax(logits / 1.1, -1)
    d = load_file(models.noisy_drafter / "model.safetensors")
    q = torch.softmax(d["markov_head.markov_w1.weight"].double() @ d["markov_head.markov_w2.weight"].double().T, -1)
    return {
        "target": ExactLaw(p, p[x0], models.support),
        "tempered_1.1": ExactLaw(hot, hot[x0], models.support),
        "accept_all_drafts": ExactLaw(q, p[x0], models.support),
    }


@pytest.fixture(scope="module")
def laws(models):
    return build_laws(models)


def _server_samples(server, laws, custom_params=None):
    sampling = {"max_new_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                "ignore_eos": True, **({"custom_params": custom_params} if custom_params else {})}
    sizes = [CALL_SIZE] * (NUM_SAMPLES // CALL_SIZE) + ([NUM_SAMPLES % CALL_SIZE] if NUM_SAMPLES % CALL_SIZE else [])
    with ThreadPoolExecutor(2) as pool:  # two calls in flight: the next batch prefills while one decodes
        outs = [o for part in pool.map(lambda k: generate(server, [PROMPT] * k, sampling), sizes)
                for o in part]
    seqs = [o["output_ids"] for o in outs]
    assert all(len(s) == 3 for s in seqs)
    # A request can lack a record only if none of its per-step statistics reached the tokenizer; the law check below
    # uses the tokens, the acceptance checks use the records that arrived. Known gap: in 1000-request /generate batches ~19% of records go missing (2026-11-29).
    recs = [o["meta_info"].get("dspark") for o in outs]
    recs = [r for r in recs if r]
    assert len(recs) >= 0.5 * len(outs), f"only {len(recs)} of {len(outs)} requests carried a dspark record"
    cells = np.array([laws["target"].cell(s) for s in seqs])
    return cells, recs


def sample_and_check(server, laws, custom_params=None, label: str = "T=1"):
    """Server samples scored against the target law: (check result, records, verified, accepted, verify lens)."""
    cells, recs = _server_samples(server, laws, custom_params)
    res = check(laws["target"], cells)
    verified = sum(r["verified"] for r in recs)
    accepted = sum(r["accepted"] for r in recs)
    lens = [v for r in recs for v in r["verify_lens"]]
    print(label, res, "verified", verified, "accepted", accepted,
          "verify-len histogram", np.bincount(lens, minlength=5).tolist())
    return res, recs, verified, accepted, lens


@pytest.mark.parametrize("drafts", ["greedy", "sampled", "none"])
def test_samples_follow_the_exact_target_law(drafts, laws, bigram_random4_server):
    """drafts: the server's default greedy drafts (q is a point mass), sampled at the request's temperature
    (custom_params dspark_draft_temperature = "request": q is the drafter's full distribution), or none
    (custom_params dspark_max_verify = 0: every step is the worker's plain decode step, whose token the worker
    draws itself instead of SGLang's sampler)."""
    custom = {"greedy": None, "sampled": {"dspark_draft_temperature": "request"},
              "none": {"dspark_max_verify": 0}}[drafts]
    res, recs, verified, accepted, lens = sample_and_check(bigram_random4_server, laws, custom, "T=1 vs target")
    assert res["kept_mass"] > 0.8, res  # the test really looks at the bulk of the law
    if drafts == "none":
        assert verified == 0 and set(lens) <= {0}, "dspark_max_verify = 0 must keep every step plain"
    else:
        assert 0 < accepted < verified, "rejection sampling must both accept and reject drafts here"
        assert set(lens) == {0, 1, 2, 3, 4} or len(lens) < 1000, "random:4 should produce every verify length"
    assert res["p"] > LAW_ALPHA, f"chi-square rejects the target law: {res}"
    assert res["tv"] < res["tv_bound"], f"TV distance above the sampling bound: {res}"


@pytest.mark.parametrize("wrong", ["tempered_1.1", "accept_all_drafts"])
def test_statistic_rejects_a_wrong_law(laws, wrong):
    """Power check: N samples from a wrong law (drawn here) must fail the same statistic against the target;
    N samples from the target law itself must pass (the checker is not too strict)."""
    rng = np.random.default_rng(0)
    n = NUM_SAMPLES

    def draw(law: ExactLaw) -> np.ndarray:
        p = np.append(law.cells, max(0.0, 1.0 - law.cells.sum()))
        ids = rng.choice(len(p), size=n, p=p / p.sum())
        ids[ids == len(law.cells)] = -1
        return ids

    bad = check(laws["target"], draw(laws[wrong]))
    good = check(laws["target"], draw(laws["target"]))
    print(wrong, "->", bad, "| control ->", good)
    assert bad["p"] < 1e-6, f"the statistic does not detect {wrong}: {bad}"
    assert good["p"] > LAW_ALPHA and good["tv"] < good["tv_bound"], good


def test_greedy_on_the_ragged_server_matches_the_exact_chain(bigram_random4_server, models):
    from transformers import AutoTokenizer

    from tests.integration.conftest import prompts
    from tests.tiny_dspark import bigram_logits

    logits = bigram_logits(models.bigram)
    tok = AutoTokenizer.from_pretrained(models.bigram)
    texts = prompts(8)
    outs = generate(bigram_random4_server, texts, {"max_new_tokens": 16, "temperature": 0.0, "ignore_eos": True})
    for text, o in zip(texts, outs):
        x, want = tok(text)["input_ids"][-1], []
        for _ in range(16):
            x = int(logits[x].argmax())
            want.append(x)
        assert o["output_ids"] == want, text
