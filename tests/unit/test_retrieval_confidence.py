"""Retrieval confidences (retrieval.RetrievalConfidence, fit_table) and the cross-request corpus adapter
(sglang_plugin.retrieval_corpus: SGLang's NgramCorpus as a library, its padded tree output read as one chain)."""

import json
import math

import numpy as np
import pytest

from sglang_dspark.retrieval import RetrievalConfidence
from sglang_dspark.retrieval.confidence import PRIOR_CAP, fit_table


def test_online_counts_converge_to_the_true_conditional_rate_and_are_calibrated():
    """Chains whose drafts are accepted independently with rate 0.7 per position: the served cell converges to 0.7
    (within the noise of the CELL_MEMORY outcomes a cell keeps: 3 sigma = 0.061) and the served survival
    predictions' ECE falls below 3 % per position."""
    rng = np.random.default_rng(0)
    conf = RetrievalConfidence(4, sources=("prompt",))
    for _ in range(4000):
        p = conf.probs("prompt", 3, 1, 4)
        hits = rng.random(4) < 0.7
        accepted = int(np.argmin(hits)) if not hits.all() else 4
        conf.observe("prompt", 3, 1, p, 4, accepted)
    assert conf.probs("prompt", 3, 1, 4) == pytest.approx([0.7] * 4, abs=0.061)
    ece = conf.ece("prompt")
    assert all(e < 0.03 for e in ece), ece
    assert conf.scored("prompt", window=False) == [4000] * 4 and conf.scored("prompt") == [1024] * 4



def test_served_ece_floor_falls_with_predictions_and_a_miscalibration_stands_out():
    """Over everything served: calibrated predictions sit near their label-noise floor, which falls as
    1 / sqrt(predictions) (the 1024-window's does not); predictions 0.2 too high show ~0.2 above it."""
    rng = np.random.default_rng(1)

    def serve(n, shift):
        conf = RetrievalConfidence(1, sources=("prompt",))
        for _ in range(n):
            p = rng.uniform(0.1, 0.7)
            conf.observe("prompt", 3, 1, np.array([min(p + shift, 1.0)]), 1, int(rng.random() < p))
        return conf

    small, large = serve(1000, 0.0), serve(16000, 0.0)
    (ece_s,), (floor_s,) = small.served_ece("prompt")
    (ece_l,), (floor_l,) = large.served_ece("prompt")
    assert floor_l == pytest.approx(floor_s / 4, rel=0.25)  # 16x the predictions, a quarter of the floor
    assert ece_l < 2.5 * floor_l and ece_l < 0.015
    assert large.windowed_ece("prompt")[1][0] > 2 * floor_l  # the window keeps its ~1024-prediction floor
    (ece_bad,), (floor_bad,) = serve(16000, 0.2).served_ece("prompt")
    assert ece_bad == pytest.approx(0.2, abs=0.02) and floor_bad < 0.01
    assert [math.isnan(x) for x in RetrievalConfidence(1).served_ece("corpus")[0]] == [True]


def test_a_miscalibrated_prior_shows_in_the_ece_before_it_is_learnt():
    conf = RetrievalConfidence(2, sources=("prompt",))
    p = conf.probs("prompt", 1, 1, 2)
    for _ in range(10):  # every draft rejected while the prior says ~0.3-0.4
        conf.observe("prompt", 1, 1, p, 2, 0)
    ece = conf.ece("prompt")
    assert ece[0] == pytest.approx(p[0], abs=1e-9)  # label 0 everywhere: ECE = mean predicted survival
    assert ece[1] == pytest.approx(p[0] * p[1], abs=1e-9)  # verified too: its survival is scored against 0
    assert math.isnan(RetrievalConfidence(2).ece("corpus")[0])  # nothing served: no ECE
    assert conf.probs("prompt", 1, 1, 1)[0] < p[0]


def test_rejection_counts_only_the_first_rejected_position():
    conf = RetrievalConfidence(4, sources=("prompt",))
    before = conf.table["prompt"][0, 0, 0].copy()
    conf.observe("prompt", 1, 1, conf.probs("prompt", 1, 1, 4), 4, 2)
    delta = conf.table["prompt"][0, 0, 0] - before
    assert delta[:, 0] == pytest.approx([1, 1, 0, 0]) and delta[:, 1] == pytest.approx([0, 0, 1, 0])


def test_buckets_separate_match_lengths_and_counts():
    conf = RetrievalConfidence(3)
    for _ in range(50):
        conf.observe("prompt", 8, 4, conf.probs("prompt", 8, 4, 3), 3, 3)
    assert conf.probs("prompt", 8, 4, 3).min() > 0.8
    assert conf.probs("prompt", 2, 1, 3).max() < 0.6  # another cell: still the prior
    assert conf.probs("corpus", 8, 4, 3).max() < 0.9


def test_fit_table_learns_copyable_outputs_and_round_trips(tmp_path):
    prompt = list(range(100, 160))
    copy = [(prompt, prompt[10:50])]  # the answer copies the prompt: lookup chains are right
    fitted = fit_table(copy, 5)
    full = 3  # HISTORY_FULL: a walk reaches long matches after accepted chains
    assert fitted.probs("prompt", 8, 1, 5, full).min() > 0.7
    path = tmp_path / "retrieval_confidence.json"
    path.write_text(json.dumps(fitted.to_json()))
    loaded = RetrievalConfidence.from_file(5, path)
    assert loaded.probs("prompt", 8, 1, 5, full) == pytest.approx(fitted.probs("prompt", 8, 1, 5, full))
    assert fitted.table["prompt"].sum(-1).max() <= PRIOR_CAP + 1e-9


def test_bad_prior_files_are_refused(tmp_path):
    good = RetrievalConfidence(3).to_json()
    for broken in ({**good, "version": 9}, {**good, "count_edges": [1, 3]},
                   {**good, "table": {"prompt": [[[[-1.0, 1.0]]]]}}):
        with pytest.raises(ValueError):
            RetrievalConfidence(3, prior=broken)


def test_trie_output_is_read_as_one_chain_with_padding_removed():
    from sglang_dspark.sglang_plugin.retrieval_corpus import chains_from_trie

    w = 5
    chain = np.tril(np.ones((w, w), dtype=int))
    padded = np.eye(w, dtype=int)
    padded[:, 0] = 1  # empty slots hang off slot 0
    half = padded.copy()
    half[:3] = chain[:3]  # two real drafts, then padding
    ids = np.array([[7, 1, 2, 3, 4], [7, 0, 0, 0, 0], [7, 5, 0, 0, 0], [7, 0, 9, 0, 0]])
    masks = np.stack([chain, padded, half, half])
    out = chains_from_trie(ids.reshape(-1), masks.reshape(-1), 4, w)
    assert out[0].tokens.tolist() == [1, 2, 3, 4] and out[0].source == 2
    assert out[1] is None  # only padding: token 0 in slot 1 alone is no match
    assert out[2].tokens.tolist() == [5, 0]  # a real token 0 inside a chain stays
    assert out[3].tokens.tolist() == [0, 9]


class _Req:
    def __init__(self, rid, out):
        self.rid, self.output_ids = rid, out


def test_output_corpus_finds_other_requests_outputs_and_bounds_insertion():
    from sglang_dspark.sglang_plugin.retrieval_corpus import OutputCorpus

    corpus = OutputCorpus.create(4)
    assert corpus is not None, "SGLang's n-gram extension must build here (it ships with sglang 0.5.23)"
    a = _Req("a", [11, 12, 13, 14, 15, 16])
    corpus.add_outputs([a])  # short output: not inserted while the request runs
    assert corpus.candidates(["q1"], [[3, 11, 12]]) == [None]
    corpus.add_outputs([])  # "a" left the batch: the rest of its output goes in
    got = corpus.candidates(["q2"], [[3, 11, 12]])[0]
    assert got is not None and got.tokens.tolist() == [13, 14, 15, 16]
    assert corpus._inserted == {} and corpus._live == {}


def test_observations_count_verify_outcomes_not_prior_mass():
    conf = RetrievalConfidence(3, sources=("prompt",))
    assert conf.observations("prompt", 3, 1) == 0
    for _ in range(5):
        conf.observe("prompt", 3, 1, conf.probs("prompt", 3, 1, 3), 3, 1)
    assert conf.observations("prompt", 3, 1) == 5 and conf.observations("prompt", 8, 1) == 0


def test_a_fitted_prior_counts_as_evidence_where_it_saw_chains():
    import numpy as np

    from sglang_dspark.retrieval.confidence import fit_table

    ctx = [5, 6, 7, 8] * 6
    fitted = fit_table([(ctx[:8], ctx[8:])], 3)  # a cycle: every lookup chain is right
    loaded = RetrievalConfidence(3, sources=("prompt",), prior=fitted.to_json())
    seen = [(m, c) for m in (2, 3, 4, 6, 8) for c in (1, 2, 4) if loaded.observations("prompt", m, c) > 0]
    assert seen, "the fit observed chains, so some cells must start explored"
    m, c = seen[0]
    assert loaded.observations("prompt", m, c) == fitted.observations("prompt", m, c)
    assert np.all(loaded.probs("prompt", m, c, 3) > RetrievalConfidence(3).probs("prompt", m, c, 3))
    assert loaded.observations("prompt", 1, 8) == 0  # a cell the fit never saw stays unexplored


def test_windowed_ece_forgets_the_cold_start_and_cells_follow_a_changed_mix():
    from sglang_dspark.retrieval.confidence import CELL_MEMORY, ECE_WINDOW

    conf = RetrievalConfidence(2, sources=("prompt",))
    for _ in range(300):  # served at 0.95 while nothing is accepted: badly calibrated
        conf.observe("prompt", 3, 1, [0.95, 0.95], 1, 0)
    assert conf.ece("prompt", window=False)[0] > 0.8
    for i in range(ECE_WINDOW):  # then calibrated: predicted 0.5, accepted every other time
        conf.observe("prompt", 5, 1, [0.5, 0.5], 1, i % 2)
    assert conf.ece("prompt")[0] < 0.01 and conf.scored("prompt") == [ECE_WINDOW, 0]
    assert conf.ece("prompt", window=False)[0] > 0.15 and conf.scored("prompt", window=False)[0] == 300 + ECE_WINDOW
    assert conf.probs("prompt", 3, 1, 1)[0] < 0.05  # the 300 rejections, not the prior
    for _ in range(int(CELL_MEMORY) * 2):  # the mix changes: the same cell is now always accepted
        conf.observe("prompt", 3, 1, [0.5, 0.5], 1, 1)
    assert conf.probs("prompt", 3, 1, 1)[0] > 0.8  # without forgetting it would sit near 600 / 900


def test_history_cells_separate_requests_that_copy_from_those_that_do_not():
    from sglang_dspark.retrieval.confidence import HISTORY_FULL, HISTORY_NONE, HISTORY_REJECTED, history_state

    assert [history_state(3, 0), history_state(3, 1), history_state(3, 3)] == [HISTORY_REJECTED, 2, HISTORY_FULL]
    conf = RetrievalConfidence(3, sources=("prompt",))
    for _ in range(100):  # after a fully accepted chain the next one is accepted; after a rejection it is not
        conf.observe("prompt", 4, 1, conf.probs("prompt", 4, 1, 3, HISTORY_FULL), 3, 3, HISTORY_FULL)
        conf.observe("prompt", 4, 1, conf.probs("prompt", 4, 1, 3, HISTORY_REJECTED), 3, 0, HISTORY_REJECTED)
    assert conf.probs("prompt", 4, 1, 3, HISTORY_FULL).min() > 0.9
    assert conf.probs("prompt", 4, 1, 3, HISTORY_REJECTED)[0] < 0.1
    assert conf.probs("prompt", 4, 1, 3, HISTORY_NONE) == pytest.approx(RetrievalConfidence(3).probs("prompt", 4, 1, 3))
    assert conf.observations("prompt", 4, 1, HISTORY_FULL) == 100 and conf.observations("prompt", 4, 1) == 0


def test_a_version_1_prior_loads_as_the_same_prior_under_every_history():
    from sglang_dspark.retrieval.confidence import HISTORY_STATES

    old = RetrievalConfidence(3, sources=("prompt",))
    old.observe("prompt", 4, 1, old.probs("prompt", 4, 1, 3), 3, 3)
    v1 = {**old.to_json(), "version": 1, "table": {"prompt": old.table["prompt"][:, :, 0].tolist()}}
    v1.pop("history_states")
    loaded = RetrievalConfidence(3, sources=("prompt",), prior=v1)
    for h in range(HISTORY_STATES):
        assert loaded.probs("prompt", 4, 1, 3, h) == pytest.approx(old.probs("prompt", 4, 1, 3))
    with pytest.raises(ValueError):
        RetrievalConfidence(3, prior={**old.to_json(), "history_states": 2})


def test_fit_table_walks_like_a_server_and_records_the_history():
    from sglang_dspark.retrieval.confidence import HISTORY_FULL, HISTORY_REJECTED

    prompt = list(range(100, 160))
    fitted = fit_table([(prompt, prompt[10:50])], 5)  # copies: after the first chain every chain is accepted
    assert fitted.observations("prompt", 8, 1, HISTORY_FULL) > 0
    assert fitted.probs("prompt", 8, 1, 5, HISTORY_FULL).min() > 0.7
    assert fitted.observations("prompt", 8, 1, HISTORY_REJECTED) == 0


class _FullReq:
    def __init__(self, rid, prompt, out):
        self.rid, self.origin_input_ids, self.output_ids = rid, prompt, out
        self.sampling_params = None


def test_a_request_s_next_chain_is_priced_under_how_its_last_chain_ended():
    import torch

    from sglang_dspark.retrieval.confidence import HISTORY_FULL, HISTORY_NONE
    from sglang_dspark.sglang_plugin.retrieval_drafts import RetrievalDrafter

    drafter = RetrievalDrafter(3, "prompt", None)
    req = _FullReq("r1", [5, 6, 7, 8, 9, 10, 11], [5, 6, 7])
    prop = drafter.propose([req], torch.ones(1, dtype=torch.bool))
    assert prop.candidates[0].history == HISTORY_NONE and prop.rids == ["r1"]
    drafter.observe(prop, torch.ones(1, dtype=torch.bool), torch.tensor([3]), torch.tensor([3]))
    assert drafter.history("r1", prop.candidates[0].source) == HISTORY_FULL
    assert drafter.propose([req], torch.ones(1, dtype=torch.bool)).candidates[0].history == HISTORY_FULL
    drafter.forget("r1")
    assert drafter.history("r1", prop.candidates[0].source) == HISTORY_NONE


def test_the_ece_floor_is_what_a_calibrated_source_shows_and_a_miscalibrated_one_rises_above_it():
    rng = np.random.default_rng(3)
    calibrated, floors = [], []
    for _ in range(40):  # served chains of one position whose confidences are right: labels ~ Bernoulli(p)
        conf = RetrievalConfidence(gamma=1)
        for p in rng.uniform(0.05, 0.95, size=400):
            conf.observe("prompt", 4, 1, np.array([p]), verified=1, accepted=int(rng.random() < p))
        calibrated.append(conf.ece("prompt")[0])
        floors.append(conf.ece_floor("prompt")[0])
    assert abs(np.mean(calibrated) - np.mean(floors)) < 0.15 * np.mean(floors)  # the floor is that ECE's mean
    assert 0.02 < np.mean(floors) < 0.08  # 400 predictions over 18 bins: several percent from label noise alone
    over = RetrievalConfidence(gamma=1)
    for p in rng.uniform(0.05, 0.95, size=400):  # served at p, accepted at p / 2
        over.observe("prompt", 4, 1, np.array([p]), verified=1, accepted=int(rng.random() < p / 2))
    assert over.ece("prompt")[0] > 3 * over.ece_floor("prompt")[0]
    assert np.isnan(RetrievalConfidence(gamma=2).ece_floor("corpus")).all()  # nothing scored yet


def test_table_cells_pool_orders_and_histories_by_grade_while_prompt_cells_do_not():
    """An n-gram table outcome seen under one context length and history refines the prediction of every table
    draft of the same evidence grade and position; prompt lookup keeps its match-length and history cells apart."""
    from sglang_dspark.retrieval.confidence import HISTORY_FULL, HISTORY_NONE

    conf = RetrievalConfidence(3)
    before = {s: conf.probs(s, 8, 4, 3, HISTORY_FULL) for s in ("table", "prompt")}
    for _ in range(200):  # order 2, no history: always rejected at the first draft
        for s in ("table", "prompt"):
            conf.observe(s, 2, 4, conf.probs(s, 2, 4, 3), 3, 0, HISTORY_NONE)
    after = {s: conf.probs(s, 8, 4, 3, HISTORY_FULL) for s in ("table", "prompt")}
    assert after["table"][0] < 0.1 < before["table"][0]  # order 8 under a full history learnt it too
    assert np.allclose(after["prompt"], before["prompt"])
    assert conf.observations("table", 8, 4, HISTORY_FULL) >= 200
    other_grade = conf.probs("table", 2, 1, 1)
    assert other_grade[0] == pytest.approx(RetrievalConfidence(3).probs("table", 2, 1, 1)[0])

