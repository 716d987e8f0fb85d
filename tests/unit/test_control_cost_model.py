import json

import numpy as np
import pytest

from sglang_dspark.control import CostSample, EngineCostModel

TRUE = (0.012, 2e-5, 1e-5, 2e-9)
KEY = {"model": "Qwen3-8B", "dtype": "bfloat16", "device": "H200", "sglang_version": "0.5.23"}


def _samples(n, rng, outlier_frac=0.0, coef=TRUE, jag=None, edges=None):
    T = rng.integers(1, 2048, n)
    R = rng.integers(1, 256, n)
    K = rng.integers(0, 2_000_000, n)
    t = coef[0] + coef[1] * T + coef[2] * R + coef[3] * K + rng.normal(0, 2e-4, n)
    if jag is not None:
        t += np.asarray(jag)[np.searchsorted(edges, T, side="left")]
    bad = rng.random(n) < outlier_frac
    t[bad] *= rng.uniform(3, 10, bad.sum())  # GC pauses, recompiles, ...
    return [CostSample(int(a), int(b), int(c), float(d)) for a, b, c, d in zip(T, R, K, t)]


def test_fit_recovers_coefficients_and_ignores_outliers():
    rng = np.random.default_rng(0)
    model = EngineCostModel().fit(_samples(600, rng, outlier_frac=0.1))
    for got, want in zip(model.coef, TRUE):
        assert got == pytest.approx(want, rel=0.05)
    assert model.predict(1000, 100, 10**6) == pytest.approx(0.012 + 0.02 + 0.001 + 0.002, rel=0.02)
    # plain least squares is dragged by the same outliers (the robust fit is doing something)
    ols = np.linalg.lstsq(np.c_[np.ones(600), [[s.verify_tokens, s.num_requests, s.kv_tokens] for s in
                          _samples(600, np.random.default_rng(0), outlier_frac=0.1)]],
                          [s.step_time_s for s in _samples(600, np.random.default_rng(0), outlier_frac=0.1)],
                          rcond=None)[0]
    assert abs(ols[0] - TRUE[0]) > 5 * abs(model.coef[0] - TRUE[0])


def test_fit_learns_bucket_staircase():
    rng = np.random.default_rng(1)
    edges = [256, 512, 1024]
    jag = [0.0, 0.003, 0.006, 0.010]
    model = EngineCostModel(bucket_edges=edges).fit(_samples(800, rng, jag=jag, edges=edges))
    for T, extra in [(100, 0.0), (300, 0.003), (700, 0.006), (1500, 0.010)]:
        expect = TRUE[0] + TRUE[1] * T + TRUE[2] * 50 + TRUE[3] * 10**5 + extra
        assert model.predict(T, 50, 10**5) == pytest.approx(expect, abs=6e-4)


def test_online_update_converges_and_rejects_outliers():
    rng = np.random.default_rng(2)
    model = EngineCostModel(coef=(0.02, 0.0, 0.0, 0.0))  # badly wrong prior
    for s in _samples(400, rng):
        model.update(s.verify_tokens, s.num_requests, s.kv_tokens, s.step_time_s)
    assert model.predict(1000, 100, 10**6) == pytest.approx(0.035, rel=0.03)
    before = list(model.coef)
    accepted = model.update(1000, 100, 10**6, 0.5)  # a 14x spike
    assert not accepted and model.num_rejected >= 1 and model.coef == before
    pred, meas = model.predicted_vs_measured
    assert meas == 0.5 and pred == pytest.approx(0.035, rel=0.03)


def test_online_update_follows_a_real_regime_change():
    rng = np.random.default_rng(3)
    model = EngineCostModel().fit(_samples(300, rng))
    slower = tuple(2 * c for c in TRUE)  # e.g. a co-located job halves the GPU's speed
    for s in _samples(300, rng, coef=slower):
        model.update(s.verify_tokens, s.num_requests, s.kv_tokens, s.step_time_s)
    assert model.predict(1000, 100, 10**6) == pytest.approx(2 * 0.035, rel=0.05)
    assert model.num_regime_changes >= 1


def test_vectorised_predict_matches_scalar_and_sps():
    import torch

    model = EngineCostModel(coef=TRUE, bucket_edges=[4, 8])
    model.bucket_offsets = [0.0, 0.001, 0.002]
    T = torch.arange(1, 12)
    vec = model.predict(T, 3, 1000)
    assert vec.tolist() == pytest.approx([model.predict(int(t), 3, 1000) for t in T])
    assert model.sps(5, 3, 1000) == pytest.approx(1 / model.predict(5, 3, 1000))


def test_save_load_roundtrip_and_key_validation(tmp_path):
    model = EngineCostModel(coef=TRUE, bucket_edges=[256], key=KEY)
    model.bucket_offsets = [0.0, 0.004]
    path = tmp_path / "cost.json"
    model.save(path)
    loaded = EngineCostModel.load(path, expected_key=KEY)
    assert loaded.coef == pytest.approx(list(TRUE)) and loaded.bucket_offsets == [0.0, 0.004]
    assert loaded.predict(300, 2, 10) == pytest.approx(model.predict(300, 2, 10))
    with pytest.raises(ValueError, match="another stack"):
        EngineCostModel.load(path, expected_key={**KEY, "device": "H100"})
    with pytest.raises(ValueError, match="lacks"):
        EngineCostModel(coef=TRUE, key={"model": "x"}).save(tmp_path / "bad.json")
    broken = json.loads(path.read_text())
    broken["coef"] = [1, 2]
    path.write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="coef"):
        EngineCostModel.load(path)


def test_fit_and_online_updates_never_predict_a_negative_term():
    """A warm-up profile where KV grows with the request count, plus noise: unconstrained least squares trades a
    negative KV term against an inflated request term; ours keeps every coefficient >= 0."""
    rng = np.random.default_rng(5)
    samples = []
    for _ in range(80):
        R = int(rng.integers(1, 9))
        T = R + int(rng.integers(0, 7 * R + 1))
        K = 40 * R + int(rng.integers(0, 5))
        samples.append((T, R, K, 0.1 + 0.005 * T + 0.004 * R + rng.normal(0, 0.01)))
    model = EngineCostModel().fit(samples)
    assert min(model.coef) >= 0
    for T, R, K, y in samples:
        model.update(T, R, K, y - 0.002 * K / 40)  # measured steps that fall with KV
        assert min(model.coef) >= 0
