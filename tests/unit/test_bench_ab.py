"""bench ab: paired ratios cancel a slowdown both sides of a pair share."""

import math

import pytest

from sglang_dspark.bench.ab import paired_ratio, summarize


def test_paired_ratio_cancels_shared_drift():
    speed = [10.0, 6.0, 9.0, 4.0, 8.0]  # the machine's speed swings 2.5x between rounds
    ref = speed
    ours = [1.1 * s for s in speed]
    stats = paired_ratio(ours, ref)
    assert stats["rounds"] == 5
    assert stats["ratio"] == pytest.approx(1.1) and stats["lo95"] == pytest.approx(1.1)
    noisy = [1.1 * s * (1.02 if i % 2 else 0.98) for i, s in enumerate(speed)]
    stats = paired_ratio(noisy, ref)
    assert stats["lo95"] < 1.1 < stats["hi95"] and stats["hi95"] - stats["lo95"] < 0.06


def test_summarize_skips_incomplete_rounds_and_needs_every_policy():
    rounds = [{"temperature": 0.0, "concurrency": 1, "round": k, "tok_s": {"none": 10.0, "dspark": 12.0}}
              for k in range(3)]
    rounds.append({"temperature": 0.0, "concurrency": 1, "round": 3, "tok_s": {"none": 10.0}})  # interrupted
    (row,) = summarize(rounds, ["none", "dspark"])
    assert row["rounds"] == 3 and row["ratio"] == pytest.approx(1.2) and row["reference"] == "none"
    assert math.isclose(row["tok_s_mean"], 12.0) and math.isclose(row["reference_tok_s_mean"], 10.0)
