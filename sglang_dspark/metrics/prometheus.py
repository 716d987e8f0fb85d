"""DSpark Prometheus metrics, exported on SGLang's own /metrics (prometheus_client multiprocess mode).

SGLang sets PROMETHEUS_MULTIPROC_DIR before it spawns the scheduler when `--enable-metrics` is on; metrics created
afterwards in any of its processes land in that directory and the HTTP server's MultiProcessCollector exports them.
So the worker (scheduler process) creates DSparkMetrics lazily, and the tokenizer side (main process) records the
end-of-request tau with `observe_finished_request`. prometheus_client is imported only when metrics are on.

Units. A "request-step" is one request in one DSpark decode step. Counters are sums over request-steps of exactly the
per-step values the worker also emits into meta_info, so over any run they equal the per-request records summed:
    verify_steps_total    = sum(record["verify_steps"])     bonus_tokens_total  = verify_steps_total
    draft_steps_total     = sum(record["draft_steps"])      drafted_tokens_total = gamma * draft_steps_total
    verified_tokens_total = sum(record["verified"])         accepted_tokens_total = sum(record["accepted"])
    wasted_verify_tokens_total = sum(record["wasted"])      (verified and rejected)
Positions are 1-based draft positions 1..gamma. Per position p: verified_by_position counts request-steps with
l_r >= p, accepted_by_position those with accepted >= p (so accepted/verified = P(drafts 1..p accepted | p verified),
the realised survival that calibration compares with), calibration_predicted_by_position sums the calibrated
predicted survival prod_{i<=p} c_i over the same verified request-steps.
By source (label source = drafter | prompt | corpus: where a request-step's verified drafts came from; request-steps
with nothing proposed, and fallback steps, have no source), over the same request-steps as the records' by_source:
    request_steps_by_source_total{source=s}   = sum(record["by_source"][s]["steps"])
    verified_tokens_by_source_total{source=s} = sum(record["by_source"][s]["verified"])   (likewise accepted)
retrieval_ece{source, position} is the online ECE of a retrieval source's calibrated confidences at draft position p,
over the last retrieval.confidence.ECE_WINDOW predictions verified there; retrieval_ece_floor{source, position} is
what a perfectly calibrated source would show on those predictions (label noise), the level retrieval_ece is read
against. retrieval_ece_served / retrieval_ece_served_floor are the same over every prediction since start-up, and
retrieval_predictions{source, position} counts those predictions (the window's floor stays ~3%; this one falls as
1 / sqrt(predictions), so a long run can show a 3% calibration).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Sequence

from sglang_dspark.sglang_plugin.stats import SOURCE_NAMES

PREFIX = "sglang:dspark_"
LENGTH_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)
BATCH_TOKEN_BUCKETS = tuple(2**i for i in range(15))  # 1 .. 16384 tokens per verify forward
TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
TAU_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0)
FALLBACK_REASONS = ("nan", "exception")
BY_SOURCE_COUNTERS = ("request_steps_by_source", "verified_tokens_by_source", "accepted_tokens_by_source")

# name (without prefix) -> (kind, help, extra label names, kwargs)
SCHEDULER_METRICS: dict[str, tuple[str, str, tuple[str, ...], dict]] = {
    "verify_steps": ("counter", "Request-steps through a DSpark decode step (one per request per step).", (), {}),
    "draft_steps": ("counter", "Request-steps for which the drafter proposed tokens (verify steps minus fallbacks).",
                    (), {}),
    "batch_steps": ("counter", "DSpark decode batch steps (one target verify forward each).", (), {}),
    "drafted_tokens": ("counter", "Draft tokens proposed (gamma per drafted request-step).", (), {}),
    "verified_tokens": ("counter", "Draft tokens sent to the target for verification (sum of l_r).", (), {}),
    "accepted_tokens": ("counter", "Draft tokens accepted by the target.", (), {}),
    "wasted_verify_tokens": ("counter", "Draft tokens verified and rejected (verified - accepted).", (), {}),
    "bonus_tokens": ("counter", "Target-sampled tokens committed after the accepted drafts (one per request-step).",
                     (), {}),
    "fallbacks": ("counter", "Decode batch steps that fell back to plain decoding, by reason.", ("reason",), {}),
    "plain_decode_steps": ("counter", "Decode batch steps that verified nothing anywhere and ran as SGLang's plain "
                           "decode forward (no ragged verify).", (), {}),
    "unplanned_steps": ("counter", "Plain decode batch steps taken without drafts or a verify plan, because the "
                        "plans before them kept verifying nothing (their retrieval lookups found no confident chain).",
                        (), {}),
    "peek_steps": ("counter", "Batch steps of a plain streak planned after all, without a draft pass, because a "
                   "retrieval chain looked confident.", (), {}),
    "sla_floored_request_steps": ("counter", "Request-steps that carried an SLA tokens/s floor.", (), {}),
    "sla_unsatisfied_request_steps": ("counter", "Request-steps whose expected tokens/s stayed below their SLA floor "
                                      "(not enough capacity, or even l = gamma is too little).", (), {}),
    "grammar_request_steps": ("counter", "Request-steps constrained by a grammar (structured outputs: JSON schema, "
                              "regex, EBNF); they keep speculating.", (), {}),
    "grammar_forced_drafts": ("counter", "Draft positions where the request's grammar allowed exactly one token: a "
                              "certain draft.", (), {}),
    "grammar_replaced_drafts": ("counter", "Greedy drafts the grammar forbids, replaced by the drafter's best allowed "
                                "token.", (), {}),
    "grammar_copied_drafts": ("counter", "Draft positions of grammar requests copied from the grammar's jump-forward "
                              "text or from the request's prompt / output (lookup).", (), {}),
    "accepted_by_position": ("counter", "Request-steps whose accepted drafts reach position p (1-based).",
                             ("position",), {}),
    "verified_by_position": ("counter", "Request-steps whose verify length reaches position p (1-based).",
                             ("position",), {}),
    "calibration_predicted_by_position": (
        "counter", "Sum of calibrated predicted survival prod_{i<=p} c_i over verified request-steps at position p.",
        ("position",), {}),
    "request_steps_by_source": ("counter", "Request-steps whose verified drafts came from the source (drafter, "
                                "prompt/output lookup, cross-request corpus, n-gram table).", ("source",), {}),
    "verified_tokens_by_source": ("counter", "Draft tokens verified, by the source that proposed them.", ("source",),
                                  {}),
    "accepted_tokens_by_source": ("counter", "Draft tokens accepted, by the source that proposed them.", ("source",),
                                  {}),
    "accept_length": ("histogram", "Accepted drafts per request per step.", (), {"buckets": LENGTH_BUCKETS}),
    "verify_length": ("histogram", "Verify length l_r per request per step.", (), {"buckets": LENGTH_BUCKETS}),
    "batch_verify_tokens": ("histogram", "Tokens in one target verify forward: sum over requests of (1 + l_r).", (),
                            {"buckets": BATCH_TOKEN_BUCKETS}),
    "draft_time_seconds": ("histogram", "Drafter time per decode step.", (), {"buckets": TIME_BUCKETS}),
    "verify_time_seconds": ("histogram", "Target verify + accept time per decode step.", (), {"buckets": TIME_BUCKETS}),
    "verify_budget_tokens": ("gauge", "Draft tokens the controller chose to verify in the last step.", (), {}),
    "verify_capacity_tokens": ("gauge", "Most draft tokens the last step could verify (running requests x gamma).",
                               (), {}),
    "running_requests": ("gauge", "Requests in the last decode batch the controller planned for.", (), {}),
    "step_time_predicted_seconds": ("gauge", "Cost-model predicted time of the last verify step.", (), {}),
    "step_time_measured_seconds": ("gauge", "Measured time of the last verify step.", (), {}),
    "calibration_ece": ("gauge", "Online ECE of predicted prefix survival at draft position p (1-based).",
                        ("position",), {}),
    "retrieval_ece": ("gauge", "Online ECE of a retrieval source's calibrated confidences at draft position p "
                      "(1-based), over its last 1024 verified predictions.", ("source", "position"), {}),
    "retrieval_ece_floor": ("gauge", "The ECE a perfectly calibrated source would show on the same predictions as "
                            "retrieval_ece (its label-noise floor).", ("source", "position"), {}),
    "retrieval_ece_served": ("gauge", "ECE of a retrieval source's calibrated confidences at draft position p "
                             "(1-based) over every prediction verified there since start-up.", ("source", "position"),
                             {}),
    "retrieval_ece_served_floor": ("gauge", "The label-noise floor of retrieval_ece_served (a perfectly calibrated "
                                   "source's ECE on the same predictions).", ("source", "position"), {}),
    "retrieval_predictions": ("gauge", "Predictions of a retrieval source verified at draft position p since "
                              "start-up (what retrieval_ece_served is over).", ("source", "position"), {}),
    "gate_plain_ratio": ("gauge", "The plain-decode gate's rho: measured plain step over the cost model's verify "
                         "prediction at one token per request (EWMA).", (), {}),
    "gate_verify_ratio": ("gauge", "The plain-decode gate's kappa: measured verify step over its cost-model "
                          "prediction (EWMA).", (), {}),
    "controller_info": ("gauge", "Constant 1; labels name the verify-length controller, gamma and drafter.",
                        ("controller", "gamma", "drafter"), {}),
}
TOKENIZER_METRICS: dict[str, tuple[str, str, tuple[str, ...], dict]] = {
    "request_mean_tau": ("histogram", "Mean tokens per target forward of a finished request (its tau).", (),
                         {"buckets": TAU_BUCKETS}),
}

# Metric objects are process-wide singletons per registry: prometheus_client refuses a second registration.
_CREATED: dict[tuple[Any, str], Any] = {}


def metric_names() -> list[str]:
    """Every exported series family, as Prometheus sees it (counters get _total, histograms _bucket/_sum/_count)."""
    names = []
    for table in (SCHEDULER_METRICS, TOKENIZER_METRICS):
        for short, (kind, *_rest) in table.items():
            full = PREFIX + short
            names += {"counter": [full + "_total"], "gauge": [full],
                      "histogram": [full + "_bucket", full + "_sum", full + "_count"]}[kind]
    return names


def _make(kind: str, short: str, doc: str, labelnames: Sequence[str], kwargs: dict, registry):
    import prometheus_client as pc

    key = (registry, short)
    if key in _CREATED:
        return _CREATED[key]
    reg = {} if registry is None else {"registry": registry}
    name = PREFIX + short
    if kind == "counter":
        metric = pc.Counter(name, doc, labelnames, **reg)
    elif kind == "histogram":
        metric = pc.Histogram(name, doc, labelnames, **kwargs, **reg)
    else:  # the last value written wins across processes, like SGLang's own scheduler gauges
        metric = pc.Gauge(name, doc, labelnames, multiprocess_mode="mostrecent", **reg)
    _CREATED[key] = metric
    return metric


def _family(table: dict, labels: dict[str, str], registry) -> dict[str, Any]:
    base = tuple(labels)
    return {short: _make(kind, short, doc, base + extra, kw, registry)
            for short, (kind, doc, extra, kw) in table.items()}


def scheduler_labels(server_args, parallel, extra_labels: dict | None = None) -> dict[str, str]:
    """The labels SGLang puts on its scheduler metrics (model_name, engine_type, tp/pp/moe_ep[/dp] rank, extra
    --metric labels), from its ServerArgs and ParallelContext, so DSpark series line up with sglang:* series."""
    mode = str(getattr(server_args, "disaggregation_mode", "null"))
    labels = {
        "model_name": getattr(server_args, "served_model_name", None) or server_args.model_path,
        "engine_type": mode if mode in ("prefill", "decode") else "unified",
        "tp_rank": parallel.tp_rank,
        "pp_rank": parallel.pp_rank,
        "moe_ep_rank": parallel.moe_ep_rank,
    }
    if getattr(parallel, "dp_rank", None) is not None:
        labels["dp_rank"] = parallel.dp_rank
    labels.update(extra_labels or {})
    return {k: str(v) for k, v in labels.items()}


class DSparkMetrics:
    """Scheduler-side DSpark metrics for one worker. Build with create(); every observe is O(batch) Python."""

    def __init__(self, labels: dict[str, str], registry=None):
        self.labels = {k: str(v) for k, v in labels.items()}
        self.registry = registry
        self.metrics = _family(SCHEDULER_METRICS, self.labels, registry)
        self.gamma = 0
        self._positions: list[dict[str, Any]] = []
        self._by_source: list[dict[str, Any]] = []

    @classmethod
    def create(cls, labels: dict[str, str], *, enabled: bool = True, registry=None) -> DSparkMetrics | None:
        """None when metrics are off (SGLang's --enable-metrics), so the worker pays nothing."""
        return cls(labels, registry) if enabled else None

    def _m(self, short: str, **extra):
        return self.metrics[short].labels(**self.labels, **extra)

    def set_info(self, controller: str, gamma: int, drafter: str) -> None:
        """Record the controller config and pre-create every per-position / per-reason series at zero, so that
        dashboards show a flat 0 (not "no data") until something happens."""
        self._m("controller_info", controller=str(controller), gamma=str(gamma), drafter=str(drafter)).set(1)
        self.gamma = int(gamma)
        self._positions = [{short: self._m(short, position=str(p + 1)) for short in
                            ("accepted_by_position", "verified_by_position", "calibration_predicted_by_position")}
                           for p in range(self.gamma)]
        for reason in FALLBACK_REASONS:
            self._m("fallbacks", reason=reason)
        self._by_source = [self._source_series(name) for name in SOURCE_NAMES]
        for short in ("verify_steps", "draft_steps", "batch_steps", "drafted_tokens", "verified_tokens",
                      "accepted_tokens", "wasted_verify_tokens", "bonus_tokens", "plain_decode_steps", "unplanned_steps",
                      "peek_steps",
                      "sla_floored_request_steps", "sla_unsatisfied_request_steps", "grammar_request_steps",
                      "grammar_forced_drafts", "grammar_replaced_drafts", "grammar_copied_drafts"):
            self._m(short)

    def observe_step(self, stats, *, budget_tokens: int, capacity_tokens: int, running: int,
                     predicted_s: float | None, measured_s: float | None, ece_per_position: list[float] | None,
                     conf=None) -> None:
        """One decode step. stats: sglang_plugin.stats.StepStats after finish(). conf: the calibrated per-position
        acceptance probabilities Float[R, gamma] the controller saw (None on a fallback step)."""
        verify, accept = list(stats.verify_lens), list(stats.accept_lens)
        rows = len(verify)
        # the per-request "drafted" flags the worker emits into meta_info: none on a fallback step, and draft
        # skipping leaves some requests out (a StepStats without flags drafted for every row)
        drafted_rows = 0 if stats.fallback else sum(getattr(stats, "drafted", None) or [1] * rows)
        verified, accepted = sum(verify), sum(accept)
        self._m("batch_steps").inc()
        self._m("verify_steps").inc(rows)
        self._m("bonus_tokens").inc(rows)
        self._m("draft_steps").inc(drafted_rows)
        self._m("drafted_tokens").inc(drafted_rows * self.gamma)
        self._m("verified_tokens").inc(verified)
        self._m("accepted_tokens").inc(accepted)
        self._m("wasted_verify_tokens").inc(verified - accepted)
        if stats.fallback:
            self._m("fallbacks", reason=stats.fallback).inc()
        if getattr(stats, "plain_decode", False):
            self._m("plain_decode_steps").inc()
        if getattr(stats, "unplanned", False):
            self._m("unplanned_steps").inc()
        if getattr(stats, "peeked", False):
            self._m("peek_steps").inc()
        self._m("sla_floored_request_steps").inc(getattr(stats, "sla_floored", 0))
        self._m("sla_unsatisfied_request_steps").inc(getattr(stats, "sla_unsatisfied", 0))
        self._m("grammar_request_steps").inc(getattr(stats, "grammar_requests", 0))
        self._m("grammar_forced_drafts").inc(getattr(stats, "grammar_forced", 0))
        self._m("grammar_replaced_drafts").inc(getattr(stats, "grammar_replaced", 0))
        self._m("grammar_copied_drafts").inc(getattr(stats, "grammar_copied", 0))
        verify_counts, accept_counts = Counter(verify), Counter(accept)
        _observe_counts(self._m("verify_length"), verify_counts)
        _observe_counts(self._m("accept_length"), accept_counts)
        self._observe_positions(verify, verify_counts, accept_counts, conf)
        self._m("batch_verify_tokens").observe(rows + verified)
        if not stats.fallback:
            self._m("draft_time_seconds").observe(stats.draft_s)
        self._m("verify_time_seconds").observe(stats.verify_s)
        self._m("verify_budget_tokens").set(budget_tokens)
        self._m("verify_capacity_tokens").set(capacity_tokens)
        self._m("running_requests").set(running)
        if predicted_s is not None:
            self._m("step_time_predicted_seconds").set(predicted_s)
        if measured_s is not None:
            self._m("step_time_measured_seconds").set(measured_s)
        for metric, value in (("gate_plain_ratio", getattr(stats, "gate_rho", None)),
                              ("gate_verify_ratio", getattr(stats, "gate_kappa", None))):
            if value is not None:
                self._m(metric).set(value)
        for p, ece in enumerate(ece_per_position or []):
            if ece is not None and math.isfinite(ece):  # nan = nothing verified at p since the last refit
                self._m("calibration_ece", position=str(p + 1)).set(ece)
        if not stats.fallback:
            self._observe_sources(getattr(stats, "sources", None) or [], verify, accept)
        for metric in ("retrieval_ece", "retrieval_ece_floor", "retrieval_ece_served", "retrieval_ece_served_floor",
                       "retrieval_predictions"):
            for name, eces in (getattr(stats, metric, None) or {}).items():
                for p, ece in enumerate(eces or []):
                    if ece is not None and math.isfinite(ece):  # nan = no samples at p yet
                        self._m(metric, source=str(name), position=str(p + 1)).set(ece)

    def _source_series(self, name: str) -> dict[str, Any]:
        return {short: self._m(short, source=name) for short in BY_SOURCE_COUNTERS}

    def _observe_sources(self, sources: Sequence[int], verify: list[int], accept: list[int]) -> None:
        """Per-source request-steps and verified / accepted draft tokens (the rows of `sources` that name a source;
        a list that does not match the batch counts nothing, as in the per-request records)."""
        if len(sources) != len(verify):
            return
        n = len(SOURCE_NAMES)
        steps, verified, accepted = [0] * n, [0] * n, [0] * n
        for src, v, a in zip(sources, verify, accept):
            src = int(src)
            if 0 <= src < n:
                steps[src] += 1
                verified[src] += v
                accepted[src] += a
        for src in range(n):
            if not steps[src]:
                continue
            series = self._by_source[src] if self._by_source else self._source_series(SOURCE_NAMES[src])
            series["request_steps_by_source"].inc(steps[src])
            if verified[src]:
                series["verified_tokens_by_source"].inc(verified[src])
            if accepted[src]:
                series["accepted_tokens_by_source"].inc(accepted[src])

    def _observe_positions(self, verify: list[int], verify_counts: Counter, accept_counts: Counter, conf) -> None:
        gamma = len(self._positions)
        # request-steps reaching position p (1-based) = those with a length >= p
        verified_at = [sum(c for v, c in verify_counts.items() if v > p) for p in range(gamma)]
        accepted_at = [sum(c for a, c in accept_counts.items() if a > p) for p in range(gamma)]
        predicted_at = [0.0] * gamma
        if conf is not None and gamma:
            surv = conf[:, :gamma].float().clamp(0.0, 1.0).cumprod(1).cpu()
            lens = surv.new_tensor(verify).view(-1, 1)
            mask = surv.new_tensor(range(gamma)).view(1, -1) < lens
            predicted_at = (surv * mask).sum(0).tolist()
        for p, series in enumerate(self._positions):
            if verified_at[p]:
                series["verified_by_position"].inc(verified_at[p])
                series["calibration_predicted_by_position"].inc(predicted_at[p])
            if accepted_at[p]:
                series["accepted_by_position"].inc(accepted_at[p])

    def observe_request_finished(self, mean_tau: float) -> None:
        """End-of-request tau, when the caller lives in the scheduler process (the tokenizer side uses
        on_request_meta_info instead; use one of the two, not both)."""
        _tokenizer_family(self.labels, self.registry)["request_mean_tau"].labels(**self.labels).observe(mean_tau)


def _observe_counts(hist, counts: Counter) -> None:
    """hist.observe(v) count times for each value v, in one update per distinct value (a decode step has up to
    hundreds of rows but only gamma + 1 distinct lengths; each observe is a locked mmap write in multiprocess mode).
    Uses the histogram child's bucket/sum values, with a plain observe loop if prometheus_client changes them."""
    buckets, total, bounds = getattr(hist, "_buckets", None), getattr(hist, "_sum", None), getattr(
        hist, "_upper_bounds", None)
    if buckets is None or total is None or bounds is None:
        for value, count in counts.items():
            for _ in range(count):
                hist.observe(value)
        return
    for value, count in counts.items():
        total.inc(value * count)
        buckets[next(i for i, bound in enumerate(bounds) if value <= bound)].inc(count)


def _tokenizer_family(labels: dict[str, str], registry) -> dict[str, Any]:
    return _family(TOKENIZER_METRICS, labels, registry)


def request_tau(record: dict | None) -> float | None:
    """Exact tau of a per-request record: (accepted + steps) / steps (record["mean_tau"] is rounded)."""
    if not record or not record.get("verify_steps"):
        return None
    return (record["accepted"] + record["verify_steps"]) / record["verify_steps"]


def observe_finished_request(record: dict | None, labels: dict[str, str], registry=None) -> bool:
    """Observe a finished request's DSpark record (metrics/request_stats.summarize) in the calling process.
    Returns whether anything was recorded (requests that never reached a DSpark decode step have no tau)."""
    tau = request_tau(record)
    if tau is None:
        return False
    labels = {k: str(v) for k, v in labels.items()}
    _tokenizer_family(labels, registry)["request_mean_tau"].labels(**labels).observe(tau)
    return True


def tokenizer_labels(manager) -> dict[str, str]:
    """SGLang's tokenizer-metric labels that identify the server (model_name, engine_type), from its
    TokenizerManager; per-request labels (priority, custom) are left out."""
    collector_labels = getattr(getattr(manager, "metrics_collector", None), "labels", None) or {}
    labels = {"model_name": collector_labels.get("model_name", getattr(manager, "served_model_name", ""))}
    if "engine_type" in collector_labels:
        labels["engine_type"] = collector_labels["engine_type"]
    return {k: str(v) for k, v in labels.items()}


def on_request_meta_info(manager, meta_info: dict, finish_reason) -> bool:
    """AFTER hook body for TokenizerManager.update_request_meta_info (main process): when the request has just
    finished and SGLang's metrics are on, observe its tau. Call after request_stats.replace_raw_lists."""
    if finish_reason is None or not getattr(manager, "enable_metrics", False):
        return False
    return observe_finished_request(meta_info.get("dspark"), tokenizer_labels(manager))
