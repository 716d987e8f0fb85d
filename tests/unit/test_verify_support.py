"""Packed, support-only rejection sampling (verify/support.py) against the dense rule and the exact joint law."""

import pytest
import torch
from test_verify_rejection import TV_BOUND, V, _lossless_stats, _sample_continuations

from sglang_dspark.verify import accept_rejection
from sglang_dspark.verify.support import DraftDistribution, SupportDist, accept_rejection_packed, target_support
from sglang_dspark.verify.target_dist import target_probs

pytestmark = pytest.mark.usefixtures("single_thread")

TOP_K_ALL = 1 << 30  # SGLang's "no top-k"


def _dense(support: SupportDist, vocab_size: int) -> torch.Tensor:
    return torch.zeros(support.ids.shape[0], vocab_size).scatter_add_(1, support.ids, support.probs)


@pytest.mark.parametrize("first_k", [64, 3])  # 3: most rows need the widening retry
@pytest.mark.parametrize("settings", [
    dict(top_k=[20] * 8, top_p=[0.8] * 8, temp=[0.7] * 8),  # the embedded model's generation defaults
    dict(top_k=[1, 5, 20, TOP_K_ALL, TOP_K_ALL, 3, 1, TOP_K_ALL], top_p=[1, 0.9, 0.5, 0.95, 1.0, 0.3, 0.2, 0.6],
         temp=[1, 0.5, 1.3, 1, 2, 1, 1, 0.8]),
    dict(top_k=[TOP_K_ALL] * 8, top_p=[1.0] * 8, temp=[1.0] * 8),  # full support: whole-vocabulary fallback
    dict(top_k=[TOP_K_ALL] * 8, top_p=[1.0] * 8, temp=[1.0] * 8, min_p=[0.05] * 8),
    dict(top_k=[50] * 8, top_p=[0.99] * 8, temp=[1.0] * 8, min_p=[0.0, 0.1, 0.2, 0.3, 0.0, 0.1, 0.2, 0.3]),
])
def test_target_support_equals_dense_target_probs(settings, first_k):
    g = torch.Generator().manual_seed(0)
    N, VV = 8, 3000
    logits = torch.randn(N, VV, generator=g) * 4
    top_k, top_p = torch.tensor(settings["top_k"]), torch.tensor(settings["top_p"], dtype=torch.float32)
    temp = torch.tensor(settings["temp"], dtype=torch.float32)
    min_p = torch.tensor(settings["min_p"]) if "min_p" in settings else None
    want = target_probs(logits, temp, top_k, top_p, min_p)
    got = target_support(logits, temp, top_k, top_p, min_p, first_k=first_k)
    assert torch.allclose(_dense(got, VV), want, atol=1e-6, rtol=1e-4)
    # the support is found without sorting the vocabulary when top-k bounds it
    if max(settings["top_k"]) <= first_k:
        assert got.ids.shape[1] <= first_k


def _random_case(seed, R=64, G=5, VV=40, vocab_size=30):
    g = torch.Generator().manual_seed(seed)
    p = target_probs(torch.randn(R * (G + 1), VV, generator=g) * 2, torch.ones(R * (G + 1)),
                     torch.full((R * (G + 1),), 12), torch.full((R * (G + 1),), 0.9)).view(R, G + 1, VV)
    vocab = torch.randperm(VV, generator=g)[:vocab_size].sort().values
    draft_logits = torch.randn(R, G, vocab_size, generator=g) * 2
    temps = torch.rand(R, generator=g) + 0.5
    temps[::7] = 0.0  # some requests draft greedily (point masses) within a sampled batch
    dense_q = torch.zeros(R, G, VV)
    dense_q[..., vocab] = torch.softmax(draft_logits / temps.clamp_min(1e-6).view(-1, 1, 1), -1)
    cols = torch.multinomial(dense_q.view(-1, VV), 1, generator=g).view(R, G)
    cols[temps == 0] = dense_q[temps == 0].argmax(-1)
    dense_q[temps == 0] = torch.nn.functional.one_hot(cols[temps == 0], VV).float()
    lens = torch.randint(0, G + 1, (R,), generator=g)
    lens[3] = 0
    u = torch.rand(R, G, generator=g)
    return p, dense_q, draft_logits, temps, vocab, cols, lens, u


def _packed(p: torch.Tensor, lens: torch.Tensor) -> SupportDist:
    """Dense [R, G+1, V] target rows -> packed support rows (full vocabulary as the support)."""
    R, G1, VV = p.shape
    take = torch.arange(G1).view(1, -1) < (lens + 1).view(-1, 1)
    rows = p[take]
    return SupportDist(ids=torch.arange(VV).expand(rows.shape[0], VV).contiguous(), probs=rows)


def test_packed_accept_decisions_equal_dense_rule():
    for seed in range(3):
        p, q, draft_logits, temps, vocab, drafts, lens, u = _random_case(seed)
        R = p.shape[0]
        dense = accept_rejection(drafts, q, p, lens, uniforms=u)
        draft = DraftDistribution(draft_logits, temps, torch.arange(R), vocab)
        packed = accept_rejection_packed(drafts, lens, _packed(p, lens), draft, uniforms=u)
        assert torch.equal(packed.accept_lens, dense.accept_lens)
        # the bonus of a rejecting request lies in the residual's support, else in p's
        rows = torch.arange(R)
        a = packed.accept_lens
        pa, qa = p[rows, a], q[rows, a.clamp(max=q.shape[1] - 1)]
        b = packed.bonus_tokens
        rejected = a < lens
        assert bool((pa[rows, b] > 0).all())
        assert bool((pa[rows, b] > qa[rows, b])[rejected].all())


def test_requests_not_drafted_verify_nothing_and_sample_p():
    p = torch.zeros(2, 3, 4)
    p[:, 0, 2] = 1.0
    draft = DraftDistribution(torch.zeros(1, 2, 4), torch.tensor([1.0, 1.0]), torch.tensor([-1, 0]))
    res = accept_rejection_packed(torch.tensor([[0, 0], [1, 1]]), torch.tensor([0, 0]), _packed(p, torch.zeros(2)),
                                  draft)
    assert res.accept_lens.tolist() == [0, 0] and res.bonus_tokens.tolist() == [2, 2]


def test_row_count_mismatch_is_an_error():
    with pytest.raises(ValueError, match="rows"):
        accept_rejection_packed(torch.zeros(2, 2, dtype=torch.long), torch.tensor([1, 1]),
                                SupportDist(torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1)), None)


# ------------------------------------------------------------------------------------- losslessness (T = 1)

def _packed_rule(vocab=None, point_mass=False):
    """The test_verify_rejection harness hands dense q / p; feed them to the packed rule (q as log-probabilities,
    restricted to `vocab` when given)."""

    def verify(drafts, q, p, lens, gen):
        n = drafts.shape[0]
        logits = q.float().clamp_min(1e-30).log()
        if vocab is not None:
            logits = logits[..., vocab]
        temps = torch.zeros(n) if point_mass else torch.ones(n)
        draft = DraftDistribution(logits, temps, torch.arange(n), vocab)
        return accept_rejection_packed(drafts, lens, _packed(p.float(), lens), draft, gen)

    return verify


@pytest.mark.parametrize("point_mass", [False, True], ids=["sampled-drafter", "greedy-drafter"])
def test_packed_rule_is_lossless(point_mass):
    pvalue, tv = _lossless_stats(_sample_continuations(_packed_rule(point_mass=point_mass),
                                                       point_mass_drafter=point_mass, seed=1))
    assert pvalue > 0.01, (pvalue, tv)
    assert tv < TV_BOUND, (pvalue, tv)


def test_packed_rule_with_reduced_draft_vocab_is_lossless(monkeypatch):
    """A drafter whose vocabulary lacks token V-1 (q is 0 there): the target's law must still come out."""
    import test_verify_rejection as harness

    restricted = harness.DRAFTER.clone()
    restricted[:, V - 1] = 0
    monkeypatch.setattr(harness, "DRAFTER", restricted / restricted.sum(-1, keepdim=True))
    pvalue, tv = _lossless_stats(_sample_continuations(_packed_rule(vocab=torch.arange(V - 1)), seed=2))
    assert pvalue > 0.01, (pvalue, tv)
    assert tv < TV_BOUND, (pvalue, tv)


def test_packed_rule_with_wrong_draft_probabilities_fails():
    """The test can fail: a rule that believes q is twice as large at the drafted token is caught."""
    def verify(drafts, q, p, lens, gen):
        q = q.clone()
        q.scatter_(2, drafts.unsqueeze(2), q.gather(2, drafts.unsqueeze(2)) * 2)
        return _packed_rule()(drafts, q / q.sum(-1, keepdim=True), p, lens, gen)

    pvalue, tv = _lossless_stats(_sample_continuations(verify, seed=3))
    assert pvalue < 1e-6, (pvalue, tv)


def test_sample_rows_follows_the_weights_and_never_picks_zeros():
    from sglang_dspark.sampling import sample_rows

    w = torch.tensor([[0.0, 1.0, 3.0, 0.0], [2.0, 0.0, 0.0, 2.0]])
    picks = torch.stack([sample_rows(w, torch.Generator().manual_seed(s)) for s in range(4000)], 1)
    counts0 = torch.bincount(picks[0], minlength=4).double()
    counts1 = torch.bincount(picks[1], minlength=4).double()
    assert counts0[0] == 0 and counts0[3] == 0 and counts1[1] == 0 and counts1[2] == 0
    assert abs(counts0[2] / 4000 - 0.75) < 0.03 and abs(counts1[0] / 4000 - 0.5) < 0.03


def test_sample_rows_two_level_path_on_a_vocabulary_wide_row():
    """Rows wider than 4 blocks go block first; spikes, a zeroed stretch and a one-hot row at the very end."""
    from scipy.stats import chisquare

    from sglang_dspark.sampling import BLOCK, sample_rows

    K = 50 * BLOCK + 77  # not a multiple of the block: padding must never be picked
    g = torch.Generator().manual_seed(3)
    w = torch.rand(1, K, generator=g) ** 8
    w[0, K // 3: K // 2] = 0.0
    w[0, [5, 2 * BLOCK, K - 1]] = 40.0
    one_hot = torch.zeros(1, K)
    one_hot[0, K - 1] = 1.0
    rows = torch.cat([w.expand(500, K), one_hot.expand(500, K)])
    picks = torch.cat([sample_rows(rows, g).view(2, 500) for _ in range(200)], 1)  # 100k draws per row
    assert bool((picks[1] == K - 1).all())
    counts = torch.bincount(picks[0], minlength=K).double()
    assert counts.numel() == K and counts[K // 3: K // 2].sum() == 0
    p = (w[0] / w.sum()).double()
    bins = (p.cumsum(0) * 40).long().clamp(max=39)  # 40 equal-mass bins (the spikes fall in their own)
    obs = torch.zeros(40, dtype=torch.float64).scatter_add_(0, bins, counts)
    exp = torch.zeros(40, dtype=torch.float64).scatter_add_(0, bins, p)
    exp = exp / exp.sum() * obs.sum()
    keep = exp > 0
    assert chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue > 1e-3
    # a sampler that ignores the within-block weights must fail the same check
    uniform_in_block = (picks[0] // BLOCK) * BLOCK + torch.randint(BLOCK, picks[0].shape, generator=g)
    bad = torch.bincount(uniform_in_block.clamp(max=K - 1), minlength=K).double()
    obs_bad = torch.zeros(40, dtype=torch.float64).scatter_add_(0, bins, bad)
    assert chisquare(obs_bad[keep].numpy(), exp[keep].numpy()).pvalue < 1e-6
