import pytest
import torch

from sglang_dspark.control import CalibrationMonitor, fit_sts_grid


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py: one torch thread for tiny tensors


GAMMA = 4
TRUE_TEMPS = [2.0, 0.5, 1.0, 3.0]  # acceptance really follows sigmoid(z / T_k); the raw head assumes T = 1


def _rollout(n, seed, verify_all=False):
    """Synthetic drafter logits and target outcomes with a known miscalibration."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, GAMMA, generator=gen) * 2.5 + 1.0
    accept_prob = torch.sigmoid(logits / torch.tensor(TRUE_TEMPS))
    accepted = torch.rand(n, GAMMA, generator=gen) < accept_prob
    accept_lens = torch.cumprod(accepted.long(), 1).sum(1)
    verify_lens = torch.full((n,), GAMMA) if verify_all else torch.randint(1, GAMMA + 1, (n,), generator=gen)
    accept_lens = torch.minimum(accept_lens, verify_lens)  # outcomes are only observed on verified drafts
    return logits, verify_lens, accept_lens


def test_sts_grid_recovers_temperatures():
    logits, verify_lens, accept_lens = _rollout(20_000, 0, verify_all=True)
    temps = fit_sts_grid(logits, accept_lens, verify_lens)
    for got, want in zip(temps, TRUE_TEMPS):
        assert got == pytest.approx(want, rel=0.2)


def test_monitor_detects_miscalibration_refits_and_becomes_calibrated():
    monitor = CalibrationMonitor(GAMMA, ece_threshold=0.03, min_count=500, online=True)
    logits, verify_lens, accept_lens = _rollout(8_000, 1)
    for chunk in range(8):  # 8 steps of 1000 requests
        s = slice(chunk * 1000, (chunk + 1) * 1000)
        monitor.record(logits[s], verify_lens[s], accept_lens[s])
    raw_ece = monitor.ece()
    assert bool((raw_ece > 0.05).any()) and monitor.needs_refit()
    assert monitor.counts()[0] == 8000 and monitor.counts()[-1] < 8000  # only verified positions count
    assert monitor.maybe_refit() and monitor.num_refits == 1
    assert monitor.counts().sum() == 0  # statistics restart under the new temperatures
    fresh = _rollout(8_000, 2)
    monitor.record(*fresh)
    assert float(monitor.ece().max()) < 0.03
    assert not monitor.needs_refit() and not monitor.maybe_refit()
    probs = monitor.calibrate(fresh[0])
    assert probs.shape == (8_000, GAMMA) and bool(((probs >= 0) & (probs <= 1)).all())


def test_monitor_without_online_flag_never_refits_and_accepts_injected_fit():
    calls = []

    def fake_fit(conf_logits, accepted_prefix_len, verified_len):
        calls.append((conf_logits.shape, accepted_prefix_len.shape, verified_len.shape))
        return [1.5] * GAMMA

    monitor = CalibrationMonitor(GAMMA, min_count=100, fit_fn=fake_fit)
    monitor.record(*_rollout(2_000, 3))
    assert monitor.needs_refit() and not monitor.maybe_refit()
    assert monitor.refit() == [1.5] * GAMMA and calls == [((2_000, GAMMA), (2_000,), (2_000,))]
    bad = CalibrationMonitor(GAMMA, fit_fn=lambda *a: [1.0])
    bad.record(*_rollout(10, 4))
    with pytest.raises(ValueError):
        bad.refit()


def test_ece_by_hand():
    monitor = CalibrationMonitor(2, num_bins=10)
    # logit 0 -> conf .5; survival pos0 .5, pos1 .25. Two rows verify both, one row verifies only pos0.
    logits = torch.zeros(3, 2)
    monitor.record(logits, torch.tensor([2, 2, 1]), torch.tensor([2, 0, 1]))
    # pos0 labels 1,0,1 (mean 2/3) vs pred .5 -> ECE 1/6; pos1 labels 1,0 (mean .5) vs .25 -> ECE .25
    assert monitor.ece().tolist() == pytest.approx([1 / 6, 0.25])
    assert monitor.counts().tolist() == [3, 2]


def test_sampled_rows_use_their_own_temperatures():
    import torch

    from sglang_dspark.control import CalibrationMonitor

    mon = CalibrationMonitor(2, temperatures=[1.0, 1.0], temperatures_sampled=[2.0, 4.0])
    z = torch.tensor([[2.0, 4.0], [2.0, 4.0]])
    out = mon.calibrate(z, sampled=torch.tensor([False, True]))
    assert torch.allclose(out[0], torch.sigmoid(z[0]))
    assert torch.allclose(out[1], torch.sigmoid(torch.tensor([1.0, 1.0])))
    assert torch.allclose(mon.calibrate(z), torch.sigmoid(z))  # no mask: the greedy set
    same = CalibrationMonitor(2, temperatures=[1.0, 1.0])  # no sampled set: one set serves both
    assert torch.allclose(same.calibrate(z, sampled=torch.tensor([True, True])), torch.sigmoid(z))


def test_ece_noise_floor_matches_calibrated_labels_and_shrinks_with_samples():
    from sglang_dspark.drafter.sts import ece, ece_noise_floor

    gen = torch.Generator().manual_seed(0)
    small, large = torch.rand(300, generator=gen), torch.rand(30000, generator=gen)
    floor_small, floor_large = ece_noise_floor(small), ece_noise_floor(large)
    assert floor_large < floor_small / 5  # ~ 1/sqrt(n)
    # a calibrated predictor's measured ECE scatters around the floor; a biased one sits far above it
    labels = torch.rand(300, generator=gen) < small
    assert ece(small, labels) < 3 * floor_small
    assert ece((small + 0.3).clamp(max=1), labels) > 3 * floor_small


def _affine_rollout(n, seed, slope, bias):
    """Acceptance follows sigmoid(slope * z + bias) at every position: calibrated at one end, overconfident at the
    other, which no temperature alone can fix."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, GAMMA, generator=gen) * 2.0
    accepted = torch.rand(n, GAMMA, generator=gen) < torch.sigmoid(slope * logits + bias)
    return logits, torch.cumprod(accepted.long(), 1).sum(1), torch.full((n,), GAMMA)


def test_affine_sts_recovers_slope_and_bias_and_beats_temperature_only():
    from sglang_dspark.drafter.sts import auroc, fit_sts, fit_sts_affine, survival_ece

    logits, acc, ver = _affine_rollout(6_000, 0, slope=0.6, bias=-1.0)
    temps, biases = fit_sts_affine(logits, acc, ver)
    assert 1 / temps[0] == pytest.approx(0.6, rel=0.15) and biases[0] == pytest.approx(-1.0, abs=0.2)
    held = _affine_rollout(6_000, 1, slope=0.6, bias=-1.0)
    affine = survival_ece(*held, temps, biases=biases)
    temperature_only = survival_ece(*held, fit_sts(logits, acc, ver))
    assert affine < 0.01 < temperature_only
    # log-loss keeps the ranking: the fit must not collapse to a constant (as an ECE-minimising bias would)
    assert temps[0] < 5.0
    z1, label1 = held[0][:, 0], held[1] > 0
    assert auroc(torch.sigmoid(z1 / temps[0] + biases[0]), label1) == pytest.approx(auroc(z1, label1))


def test_monitor_applies_biases_per_regime_and_a_refit_clears_them():
    monitor = CalibrationMonitor(GAMMA, temperatures=[1.0] * GAMMA, temperatures_sampled=[2.0] * GAMMA,
                                 biases=[1.0] * GAMMA, biases_sampled=[-1.0] * GAMMA)
    z = torch.zeros(2, GAMMA)
    c = monitor.calibrate(z, sampled=torch.tensor([False, True]))
    assert torch.allclose(c[0], torch.sigmoid(torch.tensor(1.0)).expand(GAMMA))
    assert torch.allclose(c[1], torch.sigmoid(torch.tensor(-1.0)).expand(GAMMA))
    with pytest.raises(ValueError, match="biases"):
        CalibrationMonitor(GAMMA, biases=[0.0])
    logits, verify_lens, accept_lens = _rollout(2_000, 3)
    monitor.record(logits, verify_lens, accept_lens)
    monitor.refit()
    assert float(monitor.calibrate(z)[0, 0]) == pytest.approx(0.5)
