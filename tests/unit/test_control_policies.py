"""fixed / threshold / sps-topk / oracle / SLA basics and make_policy parsing."""

import pytest
import torch

from sglang_dspark.control import (
    BatchContext,
    DSparkAsyncPolicy,
    DSparkPolicy,
    EngineCostModel,
    FixedPolicy,
    OraclePolicy,
    SpsTopKPolicy,
    StepOutcome,
    ThresholdPolicy,
    apply_sla,
    make_policy,
    survival,
)

COST = EngineCostModel(coef=(1.0, 0.25, 0.0, 0.0))


def _ctx(num_requests, **kw):
    return BatchContext(num_requests=num_requests, kv_lens=torch.full((num_requests,), 10, dtype=torch.long), **kw)


def test_fixed_clips_to_gamma():
    conf = torch.rand(3, 5)
    assert FixedPolicy(5, 2).choose(conf, _ctx(3)).tolist() == [2, 2, 2]
    assert FixedPolicy(5, 9).choose(conf, _ctx(3)).tolist() == [5, 5, 5]
    assert FixedPolicy(5, 0).choose(conf, _ctx(3)).tolist() == [0, 0, 0]


def test_threshold_survival_and_position_modes():
    conf = torch.tensor([[0.9, 0.8, 0.9, 0.9], [0.5, 0.99, 0.99, 0.99], [0.95, 0.95, 0.3, 0.99]])
    # survival: row0 .9 .72 .648 .583; row1 .5 ...; row2 .95 .9025 .27 ...
    assert ThresholdPolicy(4, 0.6).choose(conf, _ctx(3)).tolist() == [3, 0, 2]
    # position: every conf up to j must be >= c (stops at the first low one even if later ones are high)
    assert ThresholdPolicy(4, 0.6, mode="position").choose(conf, _ctx(3)).tolist() == [4, 0, 2]
    assert ThresholdPolicy(4, 0.0).choose(conf, _ctx(3)).tolist() == [4, 4, 4]


@pytest.mark.parametrize(
    "spec,cls",
    [("fixed:7", FixedPolicy), ("threshold:0.6", ThresholdPolicy), ("dspark", DSparkPolicy),
     ("dspark-async", DSparkAsyncPolicy), ("sps-topk", SpsTopKPolicy), ("oracle", OraclePolicy),
     (" DSpark ", DSparkPolicy)],
)
def test_make_policy_parses(spec, cls):
    policy = make_policy(spec, COST, gamma=7)
    assert isinstance(policy, cls) and policy.gamma == 7
    assert policy.name == cls.name


@pytest.mark.parametrize(
    "spec", ["", "fixed", "fixed:", "fixed:x", "fixed:-1", "fixed:2.5", "threshold:1.5", "threshold:abc", "dspark:3",
             "eagle", "oracle:1"],
)
def test_make_policy_rejects_bad_specs(spec):
    with pytest.raises(ValueError):
        make_policy(spec, COST, gamma=7)


@pytest.mark.parametrize("spec", ["dspark", "dspark-async", "sps-topk", "oracle"])
def test_make_policy_requires_cost_model(spec):
    with pytest.raises(ValueError, match="cost model"):
        make_policy(spec, None, gamma=7)


def test_sps_topk_with_table():
    # SPS falls sharply after 4 batch tokens: budget = 2 drafts for R = 2
    table = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1])
    conf = torch.tensor([[0.9, 0.9, 0.9], [0.8, 0.1, 0.1]])
    assert SpsTopKPolicy(3, sps_table=table).choose(conf, _ctx(2)).tolist() == [2, 0]


def test_oracle_spends_only_on_drafts_that_will_be_accepted():
    policy = OraclePolicy(4, EngineCostModel(coef=(1.0, 0.0, 0.0, 0.0)))  # verification is free -> take them all
    truth = torch.tensor([2, 0, 4])
    assert policy.choose(torch.rand(3, 4), _ctx(3, true_accept_lens=truth)).tolist() == [2, 0, 4]
    # a staircase that makes any extra token cost 5x the step: verify nothing (goodput 3/1 beats (3+L)/6)
    wall = EngineCostModel(coef=(1.0, 0.0, 0.0, 0.0), bucket_edges=[3])
    wall.bucket_offsets = [0.0, 5.0]
    expensive = OraclePolicy(4, wall)
    expensive.set_true_accept_lens(truth)
    assert expensive.choose(torch.rand(3, 4), _ctx(3)).tolist() == [0, 0, 0]
    # partial budget: staircase cost allows 3 extra tokens, handed out without exceeding the truth
    stair = EngineCostModel(coef=(1.0, 0.0, 0.0, 0.0), bucket_edges=[6])
    stair.bucket_offsets = [0.0, 5.0]
    lengths = OraclePolicy(4, stair).choose(torch.rand(3, 4), _ctx(3, true_accept_lens=truth))
    assert int(lengths.sum()) == 3 and bool((lengths <= truth).all())
    with pytest.raises(ValueError):
        OraclePolicy(4, COST).choose(torch.rand(3, 4), _ctx(3))


def test_sla_tops_up_requests_below_their_floor_and_reports_the_hopeless():
    cost = EngineCostModel(coef=(0.1, 0.001, 0.0, 0.0))  # ~10 steps/s
    conf = torch.tensor([[0.9] * 4, [0.9] * 4, [0.2] * 4])
    base = torch.tensor([0, 0, 0])
    floors = torch.tensor([float("nan"), 24.0, 24.0])
    res = apply_sla(base, survival(conf), floors, 0, cost)
    # SPS is judged at T_hi = 3 + 0 + 4 + 4 = 11 (floored requests charged G): 1/0.111 = 9.01 steps/s, so r1
    # needs 24/9.01 = 2.66 tokens/step -> 2 drafts (1 + .9 + .81 = 2.71); r0 has no floor
    assert res.lengths.tolist()[:2] == [0, 2]
    # r2 cannot reach 2.66 tokens/step even verifying everything (1.25 max): topped up to G, reported
    assert res.lengths[2] == 4
    assert res.unsatisfied.tolist() == [False, False, True]
    policy = DSparkPolicy(4, cost, online_cost_update=False)
    lengths = policy.choose(conf, _ctx(3, min_user_tps=floors))
    assert lengths[1] >= 2 and policy.last_unsatisfied.tolist() == [False, False, True]


def test_dspark_observe_feeds_the_cost_model():
    cost = EngineCostModel(coef=(0.01, 0.0, 0.0, 0.0))
    policy = DSparkPolicy(4, cost)
    policy.observe(StepOutcome(verify_lens=torch.tensor([2, 3]), accept_lens=torch.tensor([1, 3]), step_time_s=0.02,
                               kv_lens=torch.tensor([100, 200])))
    assert cost.num_updates == 1 and cost.predicted_vs_measured == (pytest.approx(0.01), 0.02)
