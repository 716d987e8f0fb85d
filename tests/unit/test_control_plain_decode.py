"""PlainDecodeGate: a verify plan is replaced by plain decoding exactly when plain decoding's goodput is higher."""

import torch

from sglang_dspark.control import EngineCostModel, PlainDecodeGate


def _cost():  # 10 ms + 1 ms per token in the forward
    return EngineCostModel(coef=(0.010, 0.001, 0.0, 0.0))


def test_no_override_before_a_plain_step_was_measured():
    gate = PlainDecodeGate()
    lengths = torch.tensor([2, 0])
    assert torch.equal(gate.choose(lengths, torch.full((2, 4), 0.1), _cost(), 0), lengths)


def test_override_follows_the_goodput_comparison():
    cost, gate = _cost(), PlainDecodeGate()
    gate.observe_plain(measured_s=0.006, predicted_verify_s=0.012)  # plain steps cost half a verify step
    assert abs(gate.rho - 0.5) < 1e-9
    lengths = torch.tensor([3, 3])
    # plain: 2 tokens / (0.5 * 12 ms) = 333 tok/s; verify T=8: 20 ms
    weak = torch.full((2, 4), 0.5)  # E = 2 * (1 + .5 + .25 + .125) = 3.75 -> 187 tok/s: plain wins
    assert torch.equal(gate.choose(lengths, weak, cost, 0), torch.zeros(2, dtype=torch.long))
    strong = torch.full((2, 4), 0.99)  # E = 2 * (1 + ~2.94) = 7.88 -> 394 tok/s: the plan stands
    assert torch.equal(gate.choose(lengths, strong, cost, 0), lengths)
    assert gate.overrides == 1


def test_outlier_ratios_are_ignored():
    gate = PlainDecodeGate()
    gate.observe_plain(5.0, 0.01)  # a 500x step is a hiccup, not the engine
    assert gate.rho is None


def test_measured_verify_bias_flips_a_marginal_plan():
    """A plan worth it under the model's verify cost is not once verify steps are measured 1.25x the prediction:
    plain 2 / (0.8 * 12 ms) = 208 tok/s; verify T=8 with E = 2 * (1 + .9 + .81 + .73) = 6.9 tokens: 18 ms -> 382
    tok/s (plan stands), kappa 2.0 -> 36 ms -> 191 tok/s (plain). kappa is an EWMA: it converges to the ratio."""
    cost, gate = _cost(), PlainDecodeGate()
    gate.observe_plain(measured_s=0.0096, predicted_verify_s=0.012)
    lengths = torch.tensor([3, 3])
    conf = torch.full((2, 4), 0.9)
    assert torch.equal(gate.choose(lengths, conf, cost, 0), lengths)
    for _ in range(60):
        gate.observe_verify(measured_s=0.040, predicted_verify_s=0.020)
    assert abs(gate.kappa - 2.0) < 1e-3
    assert torch.equal(gate.choose(lengths, conf, cost, 0), torch.zeros(2, dtype=torch.long))
    gate.observe_verify(measured_s=5.0, predicted_verify_s=0.020)  # a hiccup (ratio 250) is ignored
    assert abs(gate.kappa - 2.0) < 1e-3


def test_kappa_learns_verify_steps_several_times_the_profile():
    """A sampled batch's verify step measured 3x the start-up profile is the engine, not a hiccup: kappa follows."""
    gate = PlainDecodeGate()
    for _ in range(60):
        gate.observe_verify(measured_s=0.060, predicted_verify_s=0.020)
    assert abs(gate.kappa - 3.0) < 1e-3


def _run_streak(streak, verified_at, steps, joins=()):
    """Drive a PlainStreak like the worker: returns the steps that planned. verified_at: planned steps whose plan
    verifies something."""
    planned = []
    for step in range(steps):
        if streak.skip(step, joined=step in joins):
            continue
        planned.append(step)
        streak.observe(step, 3 if step in verified_at else 0)
    return planned


def test_streak_plans_every_step_while_plans_verify():
    from sglang_dspark.control.plain_decode import PlainStreak

    streak = PlainStreak()
    assert _run_streak(streak, verified_at=set(range(50)), steps=50) == list(range(50))
    assert streak.skipped == 0


def test_streak_backs_off_after_quiet_plans_then_ends_on_a_verifying_probe():
    from sglang_dspark.control.plain_decode import PlainStreak

    streak = PlainStreak(quiet_after=4, first=4, max_gap=32)
    planned = _run_streak(streak, verified_at=set(), steps=200)
    # 4 quiet plans (0-3), then probes 4, 8, 16, 32, 32 ... steps apart
    assert planned[:4] == [0, 1, 2, 3]
    gaps = [b - a for a, b in zip(planned[3:], planned[4:])]
    assert gaps[:4] == [4, 8, 16, 32] and set(gaps[4:]) == {32}, planned
    assert streak.skipped == 200 - len(planned)

    # a probe that verifies something: planning every step again
    streak = PlainStreak(quiet_after=4, first=4, max_gap=32)
    planned = _run_streak(streak, verified_at={15}, steps=40)
    assert planned[:7] == [0, 1, 2, 3, 7, 15, 16], planned
    assert planned[6:10] == [16, 17, 18, 19], "after a verifying probe the next quiet_after steps plan"


def test_a_joining_request_brings_the_probe_forward():
    from sglang_dspark.control.plain_decode import PlainStreak

    streak = PlainStreak(quiet_after=4, first=4, max_gap=32)
    planned = _run_streak(streak, verified_at=set(), steps=120)
    last = planned[-1]  # now probing 32 steps apart
    assert planned[-1] - planned[-2] == 32
    streak2 = PlainStreak(quiet_after=4, first=4, max_gap=32)
    planned2 = _run_streak(streak2, verified_at=set(), steps=last + 10, joins={last + 1})
    assert last + 4 in planned2, "a request joining after the last plan is probed first steps after it"
    assert last + 1 not in planned2


def test_peek_is_worthy_only_for_a_chain_expected_to_accept_enough():
    from sglang_dspark.control.plain_decode import PEEK_MIN_VALUE, peek_worthy

    weak = torch.tensor([[0.3, 0.3, 0.3, 0.0]])  # 0.3 + 0.09 + 0.027 < 0.5
    strong = torch.tensor([[0.9, 0.9, 0.0, 0.0]])  # 0.9 + 0.81
    assert not peek_worthy(weak, torch.tensor([True]))
    assert peek_worthy(strong, torch.tensor([True]))
    assert not peek_worthy(strong, torch.tensor([False])), "a row without a chain never interrupts the streak"
    both = torch.cat([weak, strong])
    assert peek_worthy(both, torch.tensor([True, True]))
    assert not peek_worthy(both, torch.tensor([True, False]))
    assert PEEK_MIN_VALUE > 0.3 + 0.09 + 0.027


def test_a_turned_down_peek_keeps_the_streak_and_a_verifying_one_ends_it():
    from sglang_dspark.control.plain_decode import PlainStreak

    streak = PlainStreak(quiet_after=4, first=4, max_gap=32)
    for step in range(4):
        assert not streak.skip(step)
        streak.observe(step, 0)
    assert streak.next_plan == 7
    assert streak.skip(4)  # skipped ... then planned after all for a confident chain the gate turned down
    streak.observe_peek(0)
    assert streak.skipped == 0 and streak.next_plan == 7, "a turned-down peek does not move the next probe"
    assert streak.skip(5) and streak.skip(6) and not streak.skip(7)
    streak.observe(7, 0)
    assert streak.skip(8)
    streak.observe_peek(3)  # a peek that verified 3 chain tokens: plan every step again
    assert not streak.skip(9) and streak.skipped == 2


def test_a_stale_kappa_is_re_measured_after_a_run_of_overrides():
    """Slow verify steps (another process on the cores) push kappa up; the gate then turns every plan down and no
    verify step would ever correct kappa. After explore_after overrides in a row one plan is let through; its
    measurement brings kappa back and the plans stand again."""
    cost, gate = _cost(), PlainDecodeGate(explore_after=4)
    gate.observe_plain(measured_s=0.0096, predicted_verify_s=0.012)
    lengths, conf = torch.tensor([3, 3]), torch.full((2, 4), 0.9)
    for _ in range(10):
        gate.observe_verify(measured_s=0.040, predicted_verify_s=0.020)  # contended: 2x the prediction
    plans = [gate.choose(lengths, conf, cost, 0) for _ in range(5)]
    assert [int(p.sum()) for p in plans] == [0, 0, 0, 0, 6]  # the fifth is the exploration
    assert gate.overrides == 4 and gate.explorations == 1
    for _ in range(10):  # the explored verify steps run at the model's speed again
        gate.observe_verify(measured_s=0.018, predicted_verify_s=0.020)
    assert torch.equal(gate.choose(lengths, conf, cost, 0), lengths)
    assert gate.overrides_in_a_row == 0


def test_no_exploration_while_verify_steps_keep_being_measured():
    cost, gate = _cost(), PlainDecodeGate(explore_after=2)
    gate.observe_plain(measured_s=0.006, predicted_verify_s=0.012)
    weak = torch.full((2, 4), 0.5)
    for _ in range(6):
        assert int(gate.choose(torch.tensor([3, 3]), weak, cost, 0).sum()) == 0
        gate.observe_verify(measured_s=0.020, predicted_verify_s=0.020)  # another request's verify step
    assert gate.explorations == 0
