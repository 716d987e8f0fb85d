"""Rejection-sampling verification: hand cases plus a statistical losslessness test that can fail."""

import math

import pytest
import torch

from sglang_dspark.verify import accept_rejection


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py: one torch thread for tiny tensors


V = 5  # tiny vocabulary so the joint law of 3-token continuations (125 cells) is exact and enumerable
GAMMA = 3
CONTINUATION = 3
NUM_SAMPLES = 40_000
# Pure sampling noise gives E[TV] = 0.5*sum_x sqrt(2 p_x (1-p_x) / (pi n)) = 0.019 here; the biased rules below
# land at 0.12-0.15 (correct rule, seeds 0-2: 0.016-0.022).
TV_BOUND = 0.03


def _one_hot(idx, v=V):
    return torch.nn.functional.one_hot(torch.as_tensor(idx), v).double()


# ----------------------------------------------------------------------------------------------- hand cases


def test_accept_by_ratio_and_residual_by_hand():
    # p(d)/q(d): pos0 0.5/0.5=1 -> accept for any u; pos1 0.2/0.8=0.25 -> u=0.3 rejects.
    p = torch.zeros(1, 3, 4)
    p[0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0])
    p[0, 1] = torch.tensor([0.0, 0.2, 0.8, 0.0])
    p[0, 2] = torch.tensor([0.25, 0.25, 0.25, 0.25])
    q = torch.zeros(1, 2, 4)
    q[0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0])
    q[0, 1] = torch.tensor([0.0, 0.8, 0.2, 0.0])
    drafts = torch.tensor([[0, 1]])
    res = accept_rejection(drafts, q, p, torch.tensor([2]), uniforms=torch.tensor([[0.99, 0.3]]))
    assert res.accept_lens.tolist() == [1]
    # residual max(p-q,0) at pos1 = [0,0,0.6,0] -> bonus is token 2 with certainty
    assert res.bonus_tokens.tolist() == [2]
    assert res.output_tokens.tolist() == [[0, 2, -1]]
    # u=0.2 < 0.25 accepts pos1 too; then bonus ~ p at pos 2 (uniform) - just check lengths
    res = accept_rejection(drafts, q, p, torch.tensor([2]), uniforms=torch.tensor([[0.99, 0.2]]))
    assert res.accept_lens.tolist() == [2] and res.num_output.tolist() == [3]


def test_verify_len_zero_samples_bonus_from_first_target_position():
    p = torch.zeros(2, 3, 4)
    p[:, 0, 3] = 1.0  # position 0 is a point mass on token 3
    p[:, 1:, 0] = 1.0
    q = torch.full((2, 2, 4), 0.25)
    drafts = torch.tensor([[3, 3], [0, 0]])
    res = accept_rejection(drafts, q, p, torch.tensor([0, 0]), uniforms=torch.zeros(2, 2))
    assert res.accept_lens.tolist() == [0, 0]
    assert res.bonus_tokens.tolist() == [3, 3]


def test_all_accepted_bonus_comes_from_position_verify_len():
    p = torch.zeros(1, 4, 3)
    p[0, 0, 1] = p[0, 1, 1] = 1.0
    p[0, 2, 2] = 1.0  # bonus position when verify_len == 2
    p[0, 3, 0] = 1.0
    q = _one_hot([[1, 1, 1]], 3).float()
    res = accept_rejection(torch.tensor([[1, 1, 1]]), q, p, torch.tensor([2]), uniforms=torch.zeros(1, 3))
    assert res.accept_lens.tolist() == [2] and res.bonus_tokens.tolist() == [2]


def test_residual_mass_zero_falls_back_to_p():
    # p == q: the residual is empty; forcing a rejection (u ~ 1 with ratio 1 is still accepted, so use p(d)=0 on
    # a draft that q also gives 0: impossible draft) must not crash and must sample from p.
    p = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    q = torch.tensor([[[0.0, 1.0]]])
    res = accept_rejection(torch.tensor([[0]]), q, p, torch.tensor([1]), uniforms=torch.zeros(1, 1))
    assert res.accept_lens.tolist() == [0]
    assert res.bonus_tokens.tolist() == [1]


def test_point_mass_path_equals_explicit_one_hot():
    g = torch.Generator().manual_seed(3)
    R, G, VV = 256, 4, 7
    p = torch.softmax(torch.randn(R, G + 1, VV, generator=g), -1)
    drafts = torch.randint(0, VV, (R, G), generator=g)
    lens = torch.randint(0, G + 1, (R,), generator=g)
    u = torch.rand(R, G, generator=g)
    a = accept_rejection(drafts, _one_hot(drafts, VV).float(), p, lens, torch.Generator().manual_seed(9), u)
    b = accept_rejection(drafts, None, p, lens, torch.Generator().manual_seed(9), u)
    assert torch.equal(a.output_tokens, b.output_tokens)


def test_vectorised_accept_lens_match_loop():
    g = torch.Generator().manual_seed(1)
    R, G, VV = 128, 7, 6
    p = torch.softmax(torch.randn(R, G + 1, VV, generator=g), -1)
    q = torch.softmax(torch.randn(R, G, VV, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, VV), 1, generator=g).reshape(R, G)
    lens = torch.randint(0, G + 1, (R,), generator=g)
    u = torch.rand(R, G, generator=g)
    res = accept_rejection(drafts, q, p, lens, uniforms=u)
    for r in range(R):
        a = 0
        while a < lens[r] and u[r, a] < min(1.0, (p[r, a, drafts[r, a]] / q[r, a, drafts[r, a]]).item()):
            a += 1
        assert res.accept_lens[r].item() == a
        if a < lens[r]:  # bonus must lie in the residual's support
            assert p[r, a, res.bonus_tokens[r]] > q[r, a, res.bonus_tokens[r]]


# ------------------------------------------------------------------------------------- losslessness (T = 1)


def _markov(seed, concentration):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, V, generator=g, dtype=torch.float64) * concentration
    # mixing with uniform keeps every cell of the 3-token joint above ~1e-3 so chi-square cells are well filled
    return 0.5 * torch.softmax(logits, -1) + 0.5 / V


TARGET = _markov(10, 2.0)
DRAFTER = _markov(11, 2.0)
START_TOKEN = 2


def _exact_joint():
    first = TARGET[START_TOKEN]
    joint = first[:, None, None] * TARGET[:, :, None] * TARGET[None, :, :]
    return joint.reshape(-1)


def _bias_ratio(scale):
    """Accept iff u < min(1, scale*p/q), implemented by feeding u/scale to the real rule."""

    def verify(drafts, q, p, lens, gen):
        u = torch.rand(drafts.shape, generator=gen, dtype=torch.float64)
        return accept_rejection(drafts, q, p, lens, gen, uniforms=u / scale)

    return verify


def _skip_residual(drafts, q, p, lens, gen):
    """Wrong rule: after a rejection resample from p instead of the residual max(p-q, 0)."""
    res = accept_rejection(drafts, q, p, lens, gen)
    rows = torch.arange(drafts.shape[0])
    resampled = torch.multinomial(p[rows, res.accept_lens], 1, generator=gen).squeeze(1)
    rejected = res.accept_lens < lens
    res.bonus_tokens = torch.where(rejected, resampled, res.bonus_tokens)
    res.output_tokens[rows, res.accept_lens] = res.bonus_tokens
    return res


def _correct(drafts, q, p, lens, gen):
    return accept_rejection(drafts, q, p, lens, gen)


def _sample_continuations(verify_fn, point_mass_drafter=False, seed=0):
    """Run speculative steps (vectorised over NUM_SAMPLES independent sequences) until 3 tokens exist."""
    gen = torch.Generator().manual_seed(seed)
    n = NUM_SAMPLES
    out = torch.full((n, CONTINUATION + GAMMA + 1), -1, dtype=torch.long)
    produced = torch.zeros(n, dtype=torch.long)
    last = torch.full((n,), START_TOKEN, dtype=torch.long)
    rows = torch.arange(n)
    while (produced < CONTINUATION).any():
        drafts = torch.empty(n, GAMMA, dtype=torch.long)
        q = torch.empty(n, GAMMA, V, dtype=torch.float64)
        prev = last
        for i in range(GAMMA):  # drafter chain q(x | prev)
            q_i = DRAFTER[prev]
            if point_mass_drafter:
                d_i = q_i.argmax(-1)
                q_i = _one_hot(d_i)
            else:
                d_i = torch.multinomial(q_i, 1, generator=gen).squeeze(1)
            drafts[:, i], q[:, i], prev = d_i, q_i, d_i
        contexts = torch.cat([last[:, None], drafts], 1)  # p after anchor + d_1..d_i is TARGET[token i]
        p = TARGET[contexts]
        lens = torch.randint(0, GAMMA + 1, (n,), generator=gen)
        res = verify_fn(drafts, q, p, lens, gen)
        for j in range(GAMMA + 1):  # append accepted tokens (only rows still short of CONTINUATION matter)
            take = (j < res.num_output) & (produced < CONTINUATION)
            out[rows[take], produced[take]] = res.output_tokens[take, j]
            produced = produced + take.long()
        last = res.output_tokens[rows, res.accept_lens]
    first3 = out[:, :CONTINUATION]
    return torch.bincount(first3[:, 0] * V * V + first3[:, 1] * V + first3[:, 2], minlength=V**3).double()


def _chi_square_pvalue(observed, expected):
    stat = ((observed - expected) ** 2 / expected).sum().item()
    dof = observed.numel() - 1
    try:
        from scipy.stats import chi2

        return float(chi2.sf(stat, dof))
    except ImportError:  # Wilson-Hilferty normal approximation of the chi-square tail
        z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
        return 0.5 * math.erfc(z / math.sqrt(2))


def _lossless_stats(counts):
    exact = _exact_joint()
    assert exact.min() * NUM_SAMPLES > 5  # chi-square validity
    tv = 0.5 * (counts / counts.sum() - exact).abs().sum().item()
    return _chi_square_pvalue(counts, exact * counts.sum()), tv


@pytest.mark.parametrize("point_mass", [False, True], ids=["sampled-drafter", "greedy-drafter"])
def test_rejection_sampling_is_lossless(point_mass):
    pvalue, tv = _lossless_stats(_sample_continuations(_correct, point_mass_drafter=point_mass))
    assert pvalue > 0.01, (pvalue, tv)
    assert tv < TV_BOUND, (pvalue, tv)


@pytest.mark.parametrize(
    "wrong_rule", [_bias_ratio(1.3), _skip_residual], ids=["ratio-times-1.3", "resample-from-p"]
)
def test_biased_rules_fail_the_same_test(wrong_rule):
    pvalue, tv = _lossless_stats(_sample_continuations(wrong_rule))
    assert pvalue < 1e-6 and tv >= TV_BOUND, (pvalue, tv)
