"""Algorithm 1 (dspark), its async variant, the sps-topk baseline: hand cases, losslessness, speed."""

import itertools
import statistics
import time

import pytest
import torch

from sglang_dspark.control import (
    BatchContext,
    DSparkAsyncPolicy,
    DSparkPolicy,
    EngineCostModel,
    SpsTopKPolicy,
    algorithm1,
)
from sglang_dspark.control.dspark_async import top_k_lengths
from sglang_dspark.verify import accept_rejection


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py: one torch thread for tiny tensors


def _ctx(num_requests, kv=100, **kw):
    return BatchContext(num_requests=num_requests, kv_lens=torch.full((num_requests,), kv, dtype=torch.long), **kw)


def _staircase(step_s=1.0, edge=4, jump=0.3):
    """t(T) = step_s for T <= edge, step_s + jump above: a one-step CUDA-graph-like staircase."""
    cost = EngineCostModel(coef=(step_s, 0.0, 0.0, 0.0), bucket_edges=[edge])
    cost.bucket_offsets = [0.0, jump]
    return cost


def naive_algorithm1(conf, cost, kv_tokens=0, early_break=True):
    """The reference-doc pseudo-code, line by line."""
    R, G = conf.shape
    a = torch.cumprod(conf.double(), 1)
    cand = sorted(((a[r, j].item(), r * G + j) for r in range(R) for j in range(G) if a[r, j] > 0),
                  key=lambda x: (-x[0], x[1]))
    lengths, tokens, tau = [0] * R, R, float(R)
    best, best_lengths = tau * float(cost.sps(tokens, R, kv_tokens)), list(lengths)
    for value, flat in cand:
        r, j = divmod(flat, G)
        lengths[r] = j + 1
        tokens += 1
        tau += value
        theta = tau * float(cost.sps(tokens, R, kv_tokens))
        if theta > best:
            best, best_lengths = theta, list(lengths)
        elif early_break:
            break
    return torch.tensor(best_lengths)


# ------------------------------------------------------------------------------------------- hand cases


def test_algorithm1_hand_computed_linear_cost():
    # t(T) = 1 + 0.25 T, R = 2. survivals: r0 [.9, .81], r1 [.5, .1]
    # theta: k0 2/1.5=1.333, +.9 2.9/1.75=1.657, +.81 3.71/2=1.855, +.5 4.21/2.25=1.871, +.1 4.31/2.5=1.724 (stop)
    cost = EngineCostModel(coef=(1.0, 0.25, 0.0, 0.0))
    conf = torch.tensor([[0.9, 0.9], [0.5, 0.2]])
    assert algorithm1(conf, 2, 0, cost).tolist() == [2, 1]
    assert DSparkPolicy(2, cost).choose(conf, _ctx(2)).tolist() == [2, 1]


def test_algorithm1_nothing_worth_verifying_and_everything_worth_it():
    expensive = EngineCostModel(coef=(1.0, 10.0, 0.0, 0.0))
    free = EngineCostModel(coef=(1.0, 0.0, 0.0, 0.0))
    conf = torch.tensor([[0.9, 0.9, 0.1], [0.3, 0.9, 0.9]])
    assert algorithm1(conf, 2, 0, expensive).tolist() == [0, 0]
    assert algorithm1(conf, 2, 0, free).tolist() == [3, 3]
    # zero-survival candidates are never admitted, even when verification is free
    assert algorithm1(torch.tensor([[0.9, 0.0, 0.9]]), 1, 0, free).tolist() == [1]


# Appendix-A-style example: two requests, G = 3, staircase cost (1.0 for T <= 4, 1.3 above), R = 2.
# r0 survivals .9 .81 .729. r1's second confidence depends on r1's first draft token: .95 ("confident") or .10.
#   confident r1 survivals .25 .2375 .2256 -> theta by admissions k: 2, 2.9, 3.71, 3.415 (Algorithm 1 breaks:
#   [2, 0]), 3.607, 3.79, 3.963 (argmax over all k: [3, 3]).
#   doubtful  r1 survivals .25 .025 .02375 -> theta: ..., 3.71, 3.415 (break: [2, 0]), ..., max 3.644 at k=6,
#   so the argmax stays at k=2: [2, 0]. The argmax verifies r1's first draft only when that draft is "confident".
APPENDIX_CONF_CONFIDENT = torch.tensor([[0.9, 0.9, 0.9], [0.25, 0.95, 0.95]])
APPENDIX_CONF_DOUBTFUL = torch.tensor([[0.9, 0.9, 0.9], [0.25, 0.10, 0.95]])


def test_appendix_example_break_versus_argmax():
    cost = _staircase()
    assert algorithm1(APPENDIX_CONF_CONFIDENT, 2, 0, cost).tolist() == [2, 0]
    assert naive_algorithm1(APPENDIX_CONF_CONFIDENT, cost, early_break=False).tolist() == [3, 3]
    assert SpsTopKPolicy(3, cost_model=cost).choose(APPENDIX_CONF_CONFIDENT, _ctx(2)).tolist() == [3, 3]
    # r1's second confidence is a function of r1's FIRST draft token. Only the argmax's decision about that first
    # draft changes with it - i.e. the argmax anticipates the token it is deciding about.
    assert algorithm1(APPENDIX_CONF_DOUBTFUL, 2, 0, cost).tolist() == [2, 0]
    assert SpsTopKPolicy(3, cost_model=cost).choose(APPENDIX_CONF_DOUBTFUL, _ctx(2)).tolist()[1] == 0


def _first_token_law(policy, num_trials=20_000, seed=0):
    """P(first output token of r1 = A) when r1's confidence at position 1 depends on its draft d0.

    Target at r1's first position: p = (0.7, 0.3) over tokens {A=0, B=1}; drafter q = (0.5, 0.5).
    d0 = A makes the drafter confident about what follows (conf .95), d0 = B does not (.10).
    """
    gen = torch.Generator().manual_seed(seed)
    lengths_if = {
        0: int(policy.choose(APPENDIX_CONF_CONFIDENT.clone(), _ctx(2))[1]),
        1: int(policy.choose(APPENDIX_CONF_DOUBTFUL.clone(), _ctx(2))[1]),
    }
    q = torch.tensor([0.5, 0.5])
    p = torch.tensor([0.7, 0.3])
    d0 = torch.multinomial(q, num_trials, replacement=True, generator=gen)
    drafts = torch.stack([d0, torch.zeros_like(d0), torch.zeros_like(d0)], 1)
    verify_lens = torch.where(d0 == 0, lengths_if[0], lengths_if[1]).clamp(max=1)  # first draft is what matters
    res = accept_rejection(drafts, q.expand(num_trials, 3, 2), p.expand(num_trials, 4, 2), verify_lens, gen)
    return (res.output_tokens[:, 0] == 0).double().mean().item(), lengths_if


def test_break_keeps_rejection_sampling_lossless_and_argmax_does_not():
    cost = _staircase()
    law_break, lens_break = _first_token_law(DSparkPolicy(3, cost, online_cost_update=False))
    law_argmax, lens_argmax = _first_token_law(SpsTopKPolicy(3, cost_model=cost))
    assert lens_break == {0: 0, 1: 0}  # same decision whatever d0 is
    assert lens_argmax == {0: 3, 1: 0}  # verifies d0 only when d0 == A
    assert abs(law_break - 0.7) < 0.015  # target law (std of the estimate ~0.003)
    assert abs(law_argmax - 0.85) < 0.015  # the paper's 0.7/0.3 -> 0.85/0.15 distortion


# ------------------------------------------------------------------------------------ non-anticipation


def _admission_is_non_anticipating(choose, conf, gen):
    """Perturb conf[r, j+1:] (what draft j's value influences) and check draft j's admission never changes.

    Perturbations: the extremes (all 0, all 1) and one random draw.
    """
    base = choose(conf)
    R, G = conf.shape
    for r, j in itertools.product(range(R), range(G - 1)):
        for fill in (torch.zeros(G - j - 1), torch.ones(G - j - 1), torch.rand(G - j - 1, generator=gen)):
            perturbed = conf.clone()
            perturbed[r, j + 1 :] = fill
            if (choose(perturbed)[r] > j) != (base[r] > j):
                return False
    return True


def _random_staircase(gen):
    edges = sorted(torch.randint(3, 30, (3,), generator=gen).unique().tolist())
    cost = EngineCostModel(coef=(1.0, 0.02 * torch.rand(1, generator=gen).item(), 0.0, 0.0), bucket_edges=edges)
    cost.bucket_offsets = torch.cumsum(0.3 * torch.rand(len(edges) + 1, generator=gen), 0).tolist()
    return cost


def test_admission_depends_only_on_higher_ranked_confidences():
    gen = torch.Generator().manual_seed(5)
    floors = torch.tensor([0.0, 3.0, 0.0, 2.0, float("nan")])  # SLA top-ups must not anticipate either
    for _ in range(30):
        cost = _random_staircase(gen)
        conf = torch.rand(5, 4, generator=gen) ** 0.3
        assert _admission_is_non_anticipating(lambda c: algorithm1(c, 5, 0, cost), conf, gen)
        assert _admission_is_non_anticipating(lambda c: top_k_lengths(c, 7), conf, gen)
        sla_policy = DSparkPolicy(4, cost, online_cost_update=False)
        assert _admission_is_non_anticipating(lambda c: sla_policy.choose(c, _ctx(5, min_user_tps=floors)), conf, gen)


def test_non_anticipation_check_catches_an_anticipating_rule():
    # the argmax over all k (sps-topk) on the Appendix example: zeroing r1's later confidences un-admits r1's d0
    cost = _staircase()
    gen = torch.Generator().manual_seed(0)
    argmax = SpsTopKPolicy(3, cost_model=cost)
    assert not _admission_is_non_anticipating(lambda c: argmax.choose(c, _ctx(2)), APPENDIX_CONF_CONFIDENT, gen)
    assert _admission_is_non_anticipating(lambda c: algorithm1(c, 2, 0, cost), APPENDIX_CONF_CONFIDENT, gen)


def test_policy_never_sees_token_values():
    # Same confidences, same context -> same lengths, whatever tokens were drafted (there is no way to pass them).
    cost = _staircase()
    policy = DSparkPolicy(3, cost, online_cost_update=False)
    first = policy.choose(APPENDIX_CONF_CONFIDENT, _ctx(2))
    assert torch.equal(first, policy.choose(APPENDIX_CONF_CONFIDENT.clone(), _ctx(2)))


# --------------------------------------------------------------------------------- vectorised == naive


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_equals_naive_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(10):
        R = int(torch.randint(1, 12, (1,), generator=gen))
        G = int(torch.randint(1, 8, (1,), generator=gen))
        conf = torch.rand(R, G, generator=gen) ** 0.5
        conf[torch.rand(R, G, generator=gen) < 0.05] = 0.0
        if seed % 2:
            cost = _random_staircase(gen)
        else:
            cost = EngineCostModel(coef=(0.01, 0.002 * torch.rand(1, generator=gen).item(), 1e-4, 1e-7))
        kv = int(torch.randint(0, 10_000, (1,), generator=gen))
        assert algorithm1(conf, R, kv, cost).tolist() == naive_algorithm1(conf, cost, kv).tolist()


# ------------------------------------------------------------------------------------------- async


def test_async_takes_capacity_from_two_steps_ago():
    cost = EngineCostModel(coef=(1.0, 0.05, 0.0, 0.0))
    policy = DSparkAsyncPolicy(4, cost, online_cost_update=False)
    low = torch.full((4, 4), 0.05)
    high = torch.full((4, 4), 0.99)
    # warm-up steps use synchronous Algorithm 1 on current confidences
    assert policy.choose(low, _ctx(4)).tolist() == algorithm1(low, 4, 400, cost).tolist()
    policy.choose(high, _ctx(4))
    stale_capacity = policy.capacity_from(torch.sort(low.cumprod(1).flatten(), descending=True)[0], 4, 400)
    lengths = policy.choose(high, _ctx(4))  # step 2: capacity comes from `low` (step 0)
    assert policy.last_capacity == stale_capacity == int(lengths.sum()) == 0
    lengths = policy.choose(high, _ctx(4))  # step 3: capacity from step 1 (`high`)
    assert int(lengths.sum()) == policy.last_capacity > 8


def test_async_unconstrained_search_crosses_the_staircase_and_admits_top_k():
    cost = _staircase()
    policy = DSparkAsyncPolicy(3, cost, online_cost_update=False)
    stale = torch.sort(APPENDIX_CONF_CONFIDENT.cumprod(1).flatten(), descending=True)[0]
    assert policy.capacity_from(stale, 2, 0) == 6  # Algorithm 1 would stop at 2
    # top-K by current survival; current r1 is doubtful, so its later drafts rank last
    assert top_k_lengths(APPENDIX_CONF_DOUBTFUL, 4).tolist() == [3, 1]


def test_async_handles_batch_size_change():
    cost = EngineCostModel(coef=(1.0, 0.05, 0.0, 0.0))
    policy = DSparkAsyncPolicy(3, cost, online_cost_update=False)
    for R in (8, 3, 5, 2):
        lengths = policy.choose(torch.rand(R, 3) ** 0.3, _ctx(R))
        assert lengths.shape == (R,) and int(lengths.max()) <= 3


# ------------------------------------------------------------------------------------------- speed


def test_controller_cost_256x7_under_5ms():
    gen = torch.Generator().manual_seed(0)
    cost = EngineCostModel(coef=(0.012, 2e-5, 1e-5, 2e-9), bucket_edges=[256, 512, 1024, 2048])
    cost.bucket_offsets = [0.0, 0.001, 0.002, 0.004, 0.008]
    policy = DSparkPolicy(7, cost, online_cost_update=False)
    ctx = _ctx(256, kv=2048)
    conf = torch.rand(256, 7, generator=gen) ** 0.3
    times = []
    for _ in range(60):
        start = time.perf_counter()
        policy.choose(conf, ctx)
        times.append(time.perf_counter() - start)
    assert statistics.median(times[10:]) < 5e-3


class _LinearCost:
    """t(T) = 0.1 + 0.01 T seconds."""

    def sps(self, tokens, num_requests, kv_tokens):
        return 1.0 / (0.1 + 0.01 * tokens)


def test_drafting_pays_when_verification_saves_more_than_the_draft():
    """Hand-computed: lengths [2, 1, 0], survivals r0 0.9, 0.81 (E = 1.71), r1 0.3 (E = 0.3). Plain step 0.18 s
    for 3 requests (0.06 s a token), verify step 0.21 s: 0.03 s extra over L = 3 verified tokens.
    saved = 1.71 * 0.06 - 0.02 = 0.0826, 0.3 * 0.06 - 0.01 = 0.008, 0 (nothing verified)."""
    from sglang_dspark.control.draft_value import SAVINGS_RATE, drafting_pays, verification_savings

    conf = torch.tensor([[0.9, 0.9], [0.3, 0.5], [0.99, 0.99]])
    lengths = torch.tensor([2, 1, 0])
    saved = verification_savings(lengths, conf, 0.18, 0.21)
    assert saved.tolist() == pytest.approx([0.0826, 0.008, 0.0])
    fresh = torch.full((3,), float("nan"), dtype=torch.float64)
    drafted = torch.tensor([True, True, True])
    useful, savings = drafting_pays(fresh, lengths, conf, drafted, 0.18, 0.21, 0.01)
    assert useful.tolist() == [True, False, False] and savings.tolist() == pytest.approx([0.0826, 0.008, 0.0])
    assert drafting_pays(fresh, lengths, conf, drafted, 0.18, 0.21, 0.005)[0].tolist() == [True, True, False]
    # smoothing: r1 drafted with a 0.05 s history still pays after one 0.008 s step; r0 was not drafted this step
    # (its history stays, but an undrafted request is never "paying")
    history = torch.tensor([0.0, 0.05, 0.0], dtype=torch.float64)
    useful, savings = drafting_pays(history, lengths, conf, torch.tensor([False, True, True]), 0.18, 0.21, 0.01)
    assert savings.tolist() == pytest.approx([0.0, (1 - SAVINGS_RATE) * 0.05 + SAVINGS_RATE * 0.008, 0.0])
    assert useful.tolist() == [False, True, False]
    # a verify step cheaper than the plain step it replaces costs nothing extra (no negative share)
    assert verification_savings(lengths, conf, 0.18, 0.15).tolist() == pytest.approx([0.1026, 0.018, 0.0])


def test_step_prices_use_the_gates_measured_ratios():
    """t(T) = 0.1 + 0.01 T: no gate -> plain t(2) = 0.12, verify t(5) = 0.15; a gate with rho 0.5 and kappa 2
    -> plain 0.06, verify 0.30."""
    from sglang_dspark.control import PlainDecodeGate
    from sglang_dspark.control.draft_value import step_prices

    class Cost:
        def predict(self, T, R, K):
            return 0.1 + 0.01 * T

    assert step_prices(Cost(), None, 2, 3, 0) == pytest.approx((0.12, 0.15))
    gate = PlainDecodeGate()
    gate.rho, gate.kappa = 0.5, 2.0
    assert step_prices(Cost(), gate, 2, 3, 0) == pytest.approx((0.06, 0.30))


def test_algorithm1_prices_verification_only():
    """Hand-computed: survivals ranked 0.9 (r0 j0), 0.81 (r0 j1), 0.3 (r1 j0), 0.15 (r1 j1), t(T) = 0.1 + 0.01 T:
    theta = 16.67, 22.31, 26.50, 26.73, 26.00 -> stop after 3 -> [2, 1]. The drafts are sunk: no draft term."""
    conf = torch.tensor([[0.9, 0.9], [0.3, 0.5]])
    assert algorithm1(conf, 2, 0, _LinearCost()).tolist() == [2, 1]


def test_draft_cost_model_learns_fixed_and_per_request_parts():
    from sglang_dspark.control import DraftCostModel

    model = DraftCostModel()
    assert model(3) == 0.0  # nothing learned yet: drafting looks free
    for i in range(40):
        n = 1 + i % 8
        model.update(n, 0.002 + 0.005 * n)
    assert model.d0 == pytest.approx(0.002, rel=1e-6) and model.d1 == pytest.approx(0.005, rel=1e-6)
    assert model(0) == 0.0 and model(4) == pytest.approx(0.022)
    one = DraftCostModel()
    for _ in range(10):
        one.update(4, 0.02)  # a single batch size: the whole pass is charged per request
    assert (one.d0, one.d1) == (0.0, pytest.approx(0.005))
    one.update(0, 5.0)  # nothing drafted: no information
    assert one.d1 == pytest.approx(0.005)


def test_algorithm1_compares_against_a_plain_step_when_it_is_cheaper():
    """Same case as above with free drafts. If verifying nothing runs as a plain step of 0.15 s instead of a 0.12 s
    anchors-only verify, theta_0 = 2 / 0.15 = 13.3 and every admission up to k = 3 still improves -> [2, 1];
    with a plain step of 0.05 s (theta_0 = 40) nothing beats it -> [0, 0]."""
    conf = torch.tensor([[0.9, 0.9], [0.3, 0.5]])
    assert algorithm1(conf, 2, 0, _LinearCost(), plain_step_s=0.15).tolist() == [2, 1]
    assert algorithm1(conf, 2, 0, _LinearCost(), plain_step_s=0.05).tolist() == [0, 0]


def test_algorithm1_verify_scale_makes_verify_steps_dearer():
    """verify_scale 1.5 on t(T) = 0.1 + 0.01 T: theta = 2/0.18 = 11.1, 2.9/0.195 = 14.9, 3.71/0.21 = 17.7,
    4.01/0.225 = 17.8, 4.16/0.24 = 17.3 -> still [2, 1]; against a 0.1 s plain step (theta_0 = 20) -> [0, 0]."""
    conf = torch.tensor([[0.9, 0.9], [0.3, 0.5]])
    assert algorithm1(conf, 2, 0, _LinearCost(), verify_scale=1.5).tolist() == [2, 1]
    assert algorithm1(conf, 2, 0, _LinearCost(), plain_step_s=0.1).tolist() == [2, 1]  # theta_1 = 22.3 > 20
    assert algorithm1(conf, 2, 0, _LinearCost(), plain_step_s=0.1, verify_scale=1.5).tolist() == [0, 0]
