"""DSparkMetrics: counters equal the per-request records summed, per-position and calibration series, gauges,
the tokenizer-side tau, and the export through prometheus_client's multiprocess mode (as SGLang runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

prometheus_client = pytest.importorskip("prometheus_client")

from sglang_dspark.metrics.prometheus import (  # noqa: E402
    DSparkMetrics,
    metric_names,
    observe_finished_request,
    scheduler_labels,
)
from sglang_dspark.metrics.request_stats import summarize  # noqa: E402
from sglang_dspark.sglang_plugin.stats import SOURCE_NAMES, StepStats  # noqa: E402

LABELS = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
GAMMA = 4


@pytest.fixture
def registry():
    return prometheus_client.CollectorRegistry()


@pytest.fixture
def metrics(registry) -> DSparkMetrics:
    m = DSparkMetrics.create(LABELS, registry=registry)
    m.set_info("dspark", GAMMA, "/models/drafter")
    return m


def value(registry, name: str, **extra) -> float:
    v = registry.get_sample_value(name, {**LABELS, **extra})
    assert v is not None, f"{name} {extra} not exported"
    return v


def make_step(verify: list[int], accept: list[int], drafted: list[int] | None = None, fallback: str | None = None,
              draft_s: float = 0.01, verify_s: float = 0.02, sources: list[int] | None = None,
              retrieval_ece: dict | None = None) -> StepStats:
    s = StepStats(len(verify), drafted=drafted if drafted is not None else [1] * len(verify), draft_s=draft_s,
                  verify_s=verify_s, sources=list(sources or []), retrieval_ece=retrieval_ece)
    s.finish(torch.tensor(verify), torch.tensor(accept), fallback)
    return s


def observe(m: DSparkMetrics, s: StepStats, conf=None, ece=None) -> None:
    m.observe_step(s, budget_tokens=sum(s.verify_lens), capacity_tokens=s.batch_size * GAMMA, running=s.batch_size,
                   predicted_s=0.05, measured_s=s.verify_s, ece_per_position=ece, conf=conf)


def test_disabled_returns_none():
    assert DSparkMetrics.create(LABELS, enabled=False) is None


def test_counters_equal_per_request_records_summed(metrics, registry):
    """Three requests (rid 0..2) over five steps, with draft skipping and a fallback step; the per-request records
    come from request_stats.summarize over each request's per-step values (what the worker emits per request)."""
    steps = [  # (rids in the batch, verify, accept, drafted, fallback)
        ([0, 1], [4, 2], [3, 2], [1, 1], None),
        ([0, 1], [0, 0], [0, 0], [1, 1], "nan"),
        ([0, 1, 2], [1, 0, 3], [0, 0, 1], [1, 0, 1], None),
        ([1, 2], [4, 4], [4, 1], [1, 1], None),
        ([2], [2], [2], [1], None),
    ]
    per_request: dict[int, dict[str, list]] = {}
    for rids, verify, accept, drafted, fallback in steps:
        s = make_step(verify, accept, drafted, fallback)
        observe(metrics, s)
        for i, rid in enumerate(rids):
            lists = per_request.setdefault(rid, {"dspark_drafted": [], "dspark_verified": [], "dspark_accepted": []})
            lists["dspark_drafted"].append(0 if fallback else drafted[i])
            lists["dspark_verified"].append(verify[i])
            lists["dspark_accepted"].append(accept[i])
    records = [summarize(meta) for meta in per_request.values()]
    total = {k: sum(r[k] for r in records) for k in ("verify_steps", "draft_steps", "verified", "accepted", "wasted")}
    assert total == {"verify_steps": 10, "draft_steps": 7, "verified": 20, "accepted": 13, "wasted": 7}

    p = "sglang:dspark_"
    assert value(registry, p + "verify_steps_total") == total["verify_steps"]
    assert value(registry, p + "bonus_tokens_total") == total["verify_steps"]
    assert value(registry, p + "draft_steps_total") == total["draft_steps"]
    assert value(registry, p + "drafted_tokens_total") == GAMMA * total["draft_steps"]
    assert value(registry, p + "verified_tokens_total") == total["verified"]
    assert value(registry, p + "accepted_tokens_total") == total["accepted"]
    assert value(registry, p + "wasted_verify_tokens_total") == total["wasted"]
    assert value(registry, p + "batch_steps_total") == len(steps)
    assert value(registry, p + "fallbacks_total", reason="nan") == 1
    assert value(registry, p + "fallbacks_total", reason="exception") == 0
    # histograms: one observation per request-step, sums = the totals
    assert value(registry, p + "accept_length_count") == total["verify_steps"]
    assert value(registry, p + "accept_length_sum") == total["accepted"]
    assert value(registry, p + "verify_length_sum") == total["verified"]
    assert value(registry, p + "batch_verify_tokens_sum") == total["verify_steps"] + total["verified"]
    assert value(registry, p + "draft_time_seconds_count") == len(steps) - 1  # no draft ran on the fallback step
    assert value(registry, p + "verify_time_seconds_count") == len(steps)
    # per position: verified/accepted request-steps reaching position p; they sum to the totals
    verified_at = [value(registry, p + "verified_by_position_total", position=str(k)) for k in range(1, GAMMA + 1)]
    accepted_at = [value(registry, p + "accepted_by_position_total", position=str(k)) for k in range(1, GAMMA + 1)]
    assert verified_at == [7, 6, 4, 3]
    assert accepted_at == [6, 4, 2, 1]
    assert sum(verified_at) == total["verified"] and sum(accepted_at) == total["accepted"]


def test_gauges_info_and_nan_ece(metrics, registry):
    observe(metrics, make_step([3, 1], [1, 1]), ece=[0.1, float("nan"), 0.3, float("nan")])
    p = "sglang:dspark_"
    assert value(registry, p + "verify_budget_tokens") == 4
    assert value(registry, p + "verify_capacity_tokens") == 2 * GAMMA
    assert value(registry, p + "running_requests") == 2
    assert value(registry, p + "step_time_predicted_seconds") == 0.05
    assert value(registry, p + "step_time_measured_seconds") == 0.02
    assert value(registry, p + "calibration_ece", position="1") == pytest.approx(0.1)
    assert value(registry, p + "calibration_ece", position="3") == pytest.approx(0.3)
    assert registry.get_sample_value(p + "calibration_ece", {**LABELS, "position": "2"}) is None  # nan: not set
    assert value(registry, p + "controller_info", controller="dspark", gamma=str(GAMMA), drafter="/models/drafter") == 1


def by_source(registry) -> dict[str, tuple[float, float, float]]:
    """source -> (request-steps, verified, accepted) from the exported by-source counters."""
    p = "sglang:dspark_"
    return {src: tuple(value(registry, p + short + "_total", source=src) for short in
                       ("request_steps_by_source", "verified_tokens_by_source", "accepted_tokens_by_source"))
            for src in SOURCE_NAMES}


def test_by_source_counters_for_mixed_sources(metrics, registry):
    assert by_source(registry) == {src: (0, 0, 0) for src in SOURCE_NAMES}  # pre-created by set_info
    # rows: drafter, prompt, nothing proposed, corpus, drafter, n-gram table
    observe(metrics, make_step([4, 3, 0, 2, 1, 3], [2, 3, 0, 0, 1, 2], sources=[0, 1, -1, 2, 0, 3]))
    assert by_source(registry) == {"drafter": (2, 5, 3), "prompt": (1, 3, 3), "corpus": (1, 2, 0), "table": (1, 3, 2)}
    observe(metrics, make_step([2, 2], [1, 2], sources=[1, 1]))
    assert by_source(registry) == {"drafter": (2, 5, 3), "prompt": (3, 7, 6), "corpus": (1, 2, 0), "table": (1, 3, 2)}
    # fallback steps, steps without sources (older callers) and a list not matching the batch count nothing
    observe(metrics, make_step([0, 0], [0, 0], sources=[0, 2], fallback="nan"))
    observe(metrics, make_step([3], [3]))
    observe(metrics, make_step([3, 1], [3, 1], sources=[2]))
    assert by_source(registry) == {"drafter": (2, 5, 3), "prompt": (3, 7, 6), "corpus": (1, 2, 0), "table": (1, 3, 2)}
    # the all-sources totals still count every request-step
    assert value(registry, "sglang:dspark_verified_tokens_total") == 4 + 3 + 2 + 1 + 3 + 2 + 2 + 3 + 3 + 1


def test_by_source_counters_equal_per_request_records_summed(metrics, registry):
    """The per-source counters sum the records' by_source over the same request-steps."""
    steps = [  # (rids, verify, accept, sources, fallback)
        ([0, 1], [4, 2], [3, 2], [0, 1], None),
        ([0, 1], [0, 0], [0, 0], [0, 0], "exception"),
        ([0, 1, 2], [1, 0, 3], [0, 0, 1], [0, -1, 2], None),
        ([1, 2], [4, 4], [4, 1], [1, 2], None),
        ([0, 2], [3, 2], [1, 2], [3, 3], None),
    ]
    per_request: dict[int, dict[str, list]] = {}
    for rids, verify, accept, sources, fallback in steps:
        s = make_step(verify, accept, fallback=fallback, sources=sources)
        observe(metrics, s)
        row_sources = s.row_sources()
        for i, rid in enumerate(rids):
            lists = per_request.setdefault(rid, {"dspark_drafted": [], "dspark_verified": [], "dspark_accepted": [],
                                                 "dspark_source": []})
            lists["dspark_drafted"].append(0 if fallback else 1)
            lists["dspark_verified"].append(verify[i])
            lists["dspark_accepted"].append(accept[i])
            lists["dspark_source"].append(row_sources[i])
    records = [summarize(meta) for meta in per_request.values()]
    want = {src: tuple(sum(r.get("by_source", {}).get(src, {}).get(k, 0) for r in records)
                       for k in ("steps", "verified", "accepted")) for src in SOURCE_NAMES}
    assert want == {"drafter": (2, 5, 3), "prompt": (2, 6, 6), "corpus": (2, 7, 2), "table": (2, 5, 3)}
    assert by_source(registry) == want


def test_retrieval_ece_gauge_per_source_and_position(metrics, registry):
    nan = float("nan")
    observe(metrics, make_step([1], [1], sources=[1],
                               retrieval_ece={"prompt": [0.05, nan, 0.2], "corpus": [nan, 0.3]}))
    p = "sglang:dspark_retrieval_ece"
    assert value(registry, p, source="prompt", position="1") == pytest.approx(0.05)
    assert value(registry, p, source="prompt", position="3") == pytest.approx(0.2)
    assert value(registry, p, source="corpus", position="2") == pytest.approx(0.3)
    for src, pos in (("prompt", "2"), ("corpus", "1"), ("drafter", "1")):  # nan / never given: not set
        assert registry.get_sample_value(p, {**LABELS, "source": src, "position": pos}) is None
    # a later step overwrites a position and leaves a nan one at its previous value
    observe(metrics, make_step([1], [0], retrieval_ece={"prompt": [0.07, 0.1, nan]}))
    assert value(registry, p, source="prompt", position="1") == pytest.approx(0.07)
    assert value(registry, p, source="prompt", position="2") == pytest.approx(0.1)
    assert value(registry, p, source="prompt", position="3") == pytest.approx(0.2)


def test_observe_step_accepts_stats_without_source_fields(metrics, registry):
    """Old callers: a stats object with neither sources nor retrieval_ece."""
    stats = SimpleNamespace(verify_lens=[2, 1], accept_lens=[1, 1], drafted=[1, 1], fallback=None, draft_s=0.01,
                            verify_s=0.02)
    metrics.observe_step(stats, budget_tokens=3, capacity_tokens=8, running=2, predicted_s=None, measured_s=None,
                         ece_per_position=None)
    assert value(registry, "sglang:dspark_accepted_tokens_total") == 2
    assert by_source(registry) == {src: (0, 0, 0) for src in SOURCE_NAMES}


def test_calibration_predicted_sums_survival_over_verified_positions(metrics, registry):
    conf = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.9, 0.8, 0.1, 0.1]])
    observe(metrics, make_step([2, 4], [2, 1]), conf=conf)
    predicted = [value(registry, "sglang:dspark_calibration_predicted_by_position_total", position=str(k))
                 for k in range(1, GAMMA + 1)]
    # row 0 verified 2 positions: survival 0.5, 0.25; row 1 all four: 0.9, 0.72, 0.072, 0.0072
    assert predicted == pytest.approx([0.5 + 0.9, 0.25 + 0.72, 0.072, 0.0072])


def test_finished_request_tau_is_exact(registry):
    record = {"verify_steps": 3, "draft_steps": 3, "verified": 9, "accepted": 5, "wasted": 4, "mean_tau": 2.6667}
    assert observe_finished_request(record, {"model_name": "m"}, registry=registry)
    assert not observe_finished_request(None, {"model_name": "m"}, registry=registry)
    assert not observe_finished_request({"verify_steps": 0, "accepted": 0, "mean_tau": None}, {"model_name": "m"},
                                        registry=registry)
    labels = {"model_name": "m"}
    assert registry.get_sample_value("sglang:dspark_request_mean_tau_count", labels) == 1
    assert registry.get_sample_value("sglang:dspark_request_mean_tau_sum", labels) == (5 + 3) / 3


def test_scheduler_labels_match_sglang_schema():
    class Args:
        served_model_name = None
        model_path = "/models/qwen"
        disaggregation_mode = "null"

    class Par:
        tp_rank, pp_rank, moe_ep_rank, dp_rank = 1, 0, 0, None

    assert scheduler_labels(Args(), Par(), {"cluster": "a"}) == {
        "model_name": "/models/qwen", "engine_type": "unified", "tp_rank": "1", "pp_rank": "0", "moe_ep_rank": "0",
        "cluster": "a"}


def test_multiprocess_export(tmp_path):
    """As in SGLang: PROMETHEUS_MULTIPROC_DIR set before prometheus_client is imported; one process writes
    (scheduler side + tokenizer hook), a MultiProcessCollector reads. Every metric we document is exported."""
    script = textwrap.dedent("""
        import json, sys, torch
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess
        from sglang_dspark.metrics.prometheus import DSparkMetrics, on_request_meta_info
        from sglang_dspark.sglang_plugin.stats import StepStats
        m = DSparkMetrics.create({"model_name": "m", "tp_rank": "0"})
        m.set_info("fixed:3", 4, "d")
        s = StepStats(2, drafted=[1, 1], sources=[0, 1], retrieval_ece={"prompt": [0.1, float("nan")]},
                      retrieval_ece_floor={"prompt": [0.04, float("nan")]},
                      retrieval_ece_served={"prompt": [0.02, float("nan")]},
                      retrieval_ece_served_floor={"prompt": [0.01, float("nan")]},
                      retrieval_predictions={"prompt": [5000, 0]}, gate_rho=0.8, gate_kappa=1.1)
        s.finish(torch.tensor([3, 1]), torch.tensor([2, 0]), None)
        m.observe_step(s, budget_tokens=4, capacity_tokens=8, running=2, predicted_s=0.1, measured_s=0.2,
                       ece_per_position=[0.1, 0.2, 0.3, 0.4], conf=torch.full((2, 4), 0.5))
        class Manager:
            enable_metrics = True
            served_model_name = "m"
        meta = {"dspark": {"verify_steps": 2, "accepted": 2}}
        assert not on_request_meta_info(Manager(), meta, None)   # not finished yet
        assert on_request_meta_info(Manager(), meta, {"type": "length"})
        reg = CollectorRegistry(); multiprocess.MultiProcessCollector(reg)
        sys.stdout.write(generate_latest(reg).decode())
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.name: s for fam in text_string_to_metric_families(out.stdout) for s in fam.samples}
    missing = [n for n in metric_names() if n not in samples]
    assert not missing, missing
    assert samples["sglang:dspark_accepted_tokens_total"].value == 2
    assert samples["sglang:dspark_running_requests"].value == 2
    by_src = {(s.name, s.labels.get("source"), s.labels.get("position")): s.value
              for fam in text_string_to_metric_families(out.stdout) for s in fam.samples if "source" in s.labels}
    assert by_src[("sglang:dspark_verified_tokens_by_source_total", "drafter", None)] == 3
    assert by_src[("sglang:dspark_accepted_tokens_by_source_total", "prompt", None)] == 0
    assert by_src[("sglang:dspark_request_steps_by_source_total", "corpus", None)] == 0  # pre-created at zero
    assert by_src[("sglang:dspark_retrieval_ece", "prompt", "1")] == pytest.approx(0.1)
    assert ("sglang:dspark_retrieval_ece", "prompt", "2") not in by_src
    assert by_src[("sglang:dspark_retrieval_ece_floor", "prompt", "1")] == pytest.approx(0.04)
    assert by_src[("sglang:dspark_retrieval_ece_served", "prompt", "1")] == pytest.approx(0.02)
    assert by_src[("sglang:dspark_retrieval_ece_served_floor", "prompt", "1")] == pytest.approx(0.01)
    assert by_src[("sglang:dspark_retrieval_predictions", "prompt", "1")] == 5000
    assert by_src[("sglang:dspark_retrieval_predictions", "prompt", "2")] == 0
    assert samples["sglang:dspark_gate_plain_ratio"].value == pytest.approx(0.8)
    assert samples["sglang:dspark_gate_verify_ratio"].value == pytest.approx(1.1)
    assert samples["sglang:dspark_request_mean_tau_sum"].value == 2.0
    assert samples["sglang:dspark_request_mean_tau_sum"].labels == {"model_name": "m"}


def test_observe_counts_equals_observe_loop():
    from collections import Counter

    from sglang_dspark.metrics.prometheus import LENGTH_BUCKETS, _observe_counts

    values = [0, 0, 1, 3, 3, 3, 8, 9, 40]
    fast_reg, slow_reg = prometheus_client.CollectorRegistry(), prometheus_client.CollectorRegistry()
    fast = prometheus_client.Histogram("h", "h", buckets=LENGTH_BUCKETS, registry=fast_reg)
    slow = prometheus_client.Histogram("h", "h", buckets=LENGTH_BUCKETS, registry=slow_reg)
    _observe_counts(fast, Counter(values))
    for v in values:
        slow.observe(v)

    def samples(reg):
        return sorted((s.name, tuple(sorted(s.labels.items())), s.value) for m in reg.collect() for s in m.samples
                      if not s.name.endswith("_created"))

    assert samples(fast_reg) == samples(slow_reg)
