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


def test_source_summary_pools_rounds_per_policy_and_source():
    from sglang_dspark.bench.ab import source_summary

    rounds = [{"concurrency": 1, "temperature": 0.0,
               "by_source": {"dspark": {"prompt": {"steps": 4, "verified": 10, "accepted": 8},
                                        "drafter": {"steps": 4, "verified": 4, "accepted": 1}}}},
              {"concurrency": 1, "temperature": 0.0,
               "by_source": {"dspark": {"prompt": {"steps": 2, "verified": 2, "accepted": 0}}}},
              {"concurrency": 1, "temperature": 0.0}]  # a round without sources (e.g. none only)
    rows = {r["source"]: r for r in source_summary(rounds)}
    assert rows["prompt"]["steps"] == 6 and rows["prompt"]["accepted"] == 8
    assert rows["prompt"]["step_share"] == 0.6 and rows["drafter"]["step_share"] == 0.4
    assert rows["prompt"]["tau"] == round(1 + 8 / 6, 4) and rows["drafter"]["tau"] == 1.25


def test_scrape_retrieval_ece_reads_the_gauge(monkeypatch):
    import io
    import urllib.request

    from sglang_dspark.bench.ab import scrape_retrieval_ece

    text = ('# HELP x\nsglang:dspark_retrieval_ece{model_name="m",position="1",source="prompt"} 0.021\n'
            'sglang:dspark_retrieval_ece{model_name="m",position="2",source="prompt"} 0.03\n'
            'sglang:dspark_verified_tokens_total{model_name="m"} 5.0\n')
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(text.encode()))
    assert scrape_retrieval_ece("http://x") == {"prompt": {"1": 0.021, "2": 0.03}}

    def down(url, timeout):
        raise OSError("refused")

    monkeypatch.setattr(urllib.request, "urlopen", down)
    assert scrape_retrieval_ece("http://x") == {}


def test_scrape_step_counts_sums_the_step_counters(monkeypatch):
    import io
    import urllib.request

    from sglang_dspark.bench.ab import scrape_step_counts

    text = ('sglang:dspark_batch_steps_total{model_name="m"} 40.0\n'
            'sglang:dspark_batch_steps_created{model_name="m"} 1.7e9\n'
            'sglang:dspark_plain_decode_steps_total{model_name="m"} 30.0\n'
            'sglang:dspark_unplanned_steps_total{model_name="m"} 25.0\n'
            'sglang:dspark_verify_steps_total{model_name="m"} 99.0\n')
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(text.encode()))
    assert scrape_step_counts("http://x") == {"batch_steps": 40.0, "plain_decode_steps": 30.0,
                                              "unplanned_steps": 25.0}


def test_prompt_plan_gives_every_round_and_the_warm_up_prompts_of_their_own():
    from sglang_dspark.bench.ab import WARM_PROMPTS, per_round, prompt_plan

    plan, warm, needed = prompt_plan([0.0, 1.0], [1, 8, 16], 4, None)
    seen = [i for r in plan.values() for i in r] + list(warm)
    assert len(seen) == len(set(seen)) == needed  # disjoint, and nothing asked for beyond the list
    assert needed == 2 * 4 * (2 + 8 + 16) + WARM_PROMPTS
    assert all(len(plan[(t, c, k)]) == per_round(c, None) for (t, c, k) in plan)
    assert len(prompt_plan([0.0], [4], 3, 5)[0][(0.0, 4, 2)]) == 5  # --requests-per-round wins
