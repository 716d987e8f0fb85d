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
