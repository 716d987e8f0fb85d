"""Write deploy/grafana/dashboards/sglang-dspark.json (the Grafana dashboard) from the panel list below.

    python deploy/grafana/make_dashboard.py          # regenerate after editing a panel
The JSON is committed; tests/unit/test_dashboard.py checks it matches this script and is structurally valid, and
tests/integration/test_prometheus_scrape.py evaluates every expression against a live server through Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "sglang-dspark.json"
UID = "sglang-dspark"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance", model_name=~"$model"'
RI = "$__rate_interval"


def rate(metric: str, by: str = "", extra: str = "") -> str:
    """sum [by (...)] (rate(metric{selector}[interval]))"""
    grouping = f" by ({by})" if by else ""
    labels = SEL + (", " + extra if extra else "")
    return f"sum{grouping}(rate({metric}{{{labels}}}[{RI}]))"


def gauge(metric: str, agg: str = "avg") -> str:
    return f"{agg}(avg_over_time({metric}{{{SEL}}}[{RI}]))"


TAU = (f"({rate('sglang:dspark_accepted_tokens_total')} + {rate('sglang:dspark_bonus_tokens_total')})"
       f" / {rate('sglang:dspark_verify_steps_total')}")

# (title, unit, description, [(expr, legend)], options)
PANELS = [
    ("Tau: tokens per target forward", "none",
     "tau = (accepted drafts + bonus tokens) / request-steps over the window; and the mean tau of the requests "
     "that finished in it. 1.0 = no speculation benefit.",
     [(TAU, "tau (all steps)"),
      (f"{rate('sglang:dspark_request_mean_tau_sum')} / {rate('sglang:dspark_request_mean_tau_count')}",
       "mean tau of finished requests"),
      (f"histogram_quantile(0.5, {rate('sglang:dspark_request_mean_tau_bucket', by='le')})",
       "p50 tau of finished requests")], {}),
    ("Acceptance rate by draft position", "percentunit",
     "Share of request-steps that verified draft position p in which drafts 1..p were all accepted.",
     [(f"{rate('sglang:dspark_accepted_by_position_total', by='position')} / "
       f"{rate('sglang:dspark_verified_by_position_total', by='position')}", "position {{position}}")], {}),
    ("Verify budget per request vs running requests", "none",
     "Left: draft tokens verified per request per step (window average, and the controller's budget of the last "
     "step) and the ceiling gamma. "
     "Right: requests per decode batch. DSpark spends less per request as the batch grows.",
     [(f"{rate('sglang:dspark_verified_tokens_total')} / {rate('sglang:dspark_verify_steps_total')}",
       "verified drafts per request per step"),
      (f"{gauge('sglang:dspark_verify_budget_tokens')} / {gauge('sglang:dspark_running_requests')}",
       "controller budget per request (last step)"),
      (f"{gauge('sglang:dspark_verify_capacity_tokens')} / {gauge('sglang:dspark_running_requests')}",
       "capacity per request (gamma)"),
      (f"{rate('sglang:dspark_verify_steps_total')} / {rate('sglang:dspark_batch_steps_total')}",
       "running requests per step")],
     {"right_axis": ["running requests per step"]}),
    ("Wasted verify tokens/s", "short",
     "Draft tokens the target verified and rejected, per second (target compute spent on nothing), next to "
     "drafted, verified and accepted drafts per second.",
     [(rate("sglang:dspark_wasted_verify_tokens_total"), "wasted (verified, rejected)"),
      (rate("sglang:dspark_drafted_tokens_total"), "drafted"),
      (rate("sglang:dspark_verified_tokens_total"), "verified"),
      (rate("sglang:dspark_accepted_tokens_total"), "accepted")], {}),
    ("Aggregate vs per-user tokens/s", "short",
     "Aggregate: output tokens per second over all requests (SGLang's generation_tokens_total). Per-user: "
     "1 / mean time per output token of the requests that finished (SGLang's request_time_per_output_token).",
     [(rate("sglang:generation_tokens_total"), "aggregate tok/s"),
      (f"{rate('sglang:request_time_per_output_token_seconds_count')} / "
       f"{rate('sglang:request_time_per_output_token_seconds_sum')}", "per-user tok/s")],
     {"right_axis": ["per-user tok/s"]}),
    ("Calibration: predicted vs realised acceptance", "percentunit",
     "Per draft position p over verified request-steps: the controller's calibrated predicted survival "
     "prod_{i<=p} c_i (dashed) vs the realised share with drafts 1..p accepted (solid). Close lines = calibrated.",
     [(f"{rate('sglang:dspark_calibration_predicted_by_position_total', by='position')} / "
       f"{rate('sglang:dspark_verified_by_position_total', by='position')}", "predicted p{{position}}"),
      (f"{rate('sglang:dspark_accepted_by_position_total', by='position')} / "
       f"{rate('sglang:dspark_verified_by_position_total', by='position')}", "realised p{{position}}")],
     {"dashed": "predicted"}),
    ("Calibration ECE per position (online)", "none",
     "Expected calibration error of predicted prefix survival per draft position, since the last STS refit "
     "(the online calibration monitor refits when it drifts above its threshold).",
     [(f"max by (position) (avg_over_time(sglang:dspark_calibration_ece{{{SEL}}}[{RI}]))", "ECE p{{position}}")],
     {}),
    ("Cost model: predicted vs measured step time", "s",
     "The engine cost model's predicted verify-step time vs the measured one (last step, averaged over the "
     "window); relative error on the right axis. The controller's choices are only as good as this model.",
     [(gauge("sglang:dspark_step_time_predicted_seconds"), "predicted"),
      (gauge("sglang:dspark_step_time_measured_seconds"), "measured"),
      (f"abs({gauge('sglang:dspark_step_time_predicted_seconds')} - "
       f"{gauge('sglang:dspark_step_time_measured_seconds')}) / {gauge('sglang:dspark_step_time_measured_seconds')}",
       "relative error")],
     {"right_axis": ["relative error"]}),
    ("Plain-decode gate", "none",
     "The two ratios the plain-decode gate compares verify and plain steps with: a plain step's measured time over "
     "the cost model's verify prediction at one token per request (rho), and a verify step's measured time over "
     "its prediction (kappa). Verify plans are replaced by plain decoding when their expected tokens per second, "
     "priced with kappa, fall below plain decoding's, priced with rho.",
     [(gauge("sglang:dspark_gate_plain_ratio"), "rho (plain / predicted)"),
      (gauge("sglang:dspark_gate_verify_ratio"), "kappa (verify / predicted)")], {}),
    ("Fallbacks to plain decoding and draft skipping", "short",
     "Decode steps per minute that fell back to plain decoding because the drafter failed (nan: non-finite "
     "output; exception: it raised; any sustained rate is a bug). Right axis: share of request-steps the drafter "
     "ran for (the rest were skipped because the controller kept verifying nothing for them), and of batch steps run "
     "as plain decode, with and without a plan (after plans keep verifying nothing, only backed-off probe steps "
     "plan, and steps whose retrieval lookup finds a confident chain, verified without a draft pass).",
     [(f"{rate('sglang:dspark_fallbacks_total', by='reason')} * 60", "{{reason}} fallbacks per minute"),
      (f"{rate('sglang:dspark_draft_steps_total')} / {rate('sglang:dspark_verify_steps_total')}",
       "share of request-steps drafted"),
      (f"{rate('sglang:dspark_plain_decode_steps_total')} / {rate('sglang:dspark_batch_steps_total')}",
       "share of steps run as plain decode"),
      (f"{rate('sglang:dspark_unplanned_steps_total')} / {rate('sglang:dspark_batch_steps_total')}",
       "share of steps run without a plan"),
      (f"{rate('sglang:dspark_peek_steps_total')} / {rate('sglang:dspark_batch_steps_total')}",
       "share of steps planned for a retrieval chain only")],
     {"right_axis": ["share of request-steps drafted", "share of steps run as plain decode",
                     "share of steps run without a plan", "share of steps planned for a retrieval chain only"]}),
    ("SLA floors", "short",
     "Request-steps per second carrying a tokens/s floor (--dspark-min-user-tps or the request's "
     "custom_params.dspark_min_user_tps) and those whose expected rate stayed below it: the controller could not "
     "meet the floor with the capacity it had. Right axis: the unmet share.",
     [(rate("sglang:dspark_sla_floored_request_steps_total"), "floored request-steps/s"),
      (rate("sglang:dspark_sla_unsatisfied_request_steps_total"), "unmet request-steps/s"),
      (f"{rate('sglang:dspark_sla_unsatisfied_request_steps_total')} / "
       f"{rate('sglang:dspark_sla_floored_request_steps_total')}", "unmet share")],
     {"right_axis": ["unmet share"]}),
    ("Structured outputs", "short",
     "Request-steps per second under a grammar (JSON schema, regex, EBNF): they keep speculating, each against "
     "its own grammar. Forced: draft positions where the grammar allowed one token (certain drafts). Replaced: "
     "greedy drafts the grammar forbids, swapped for the drafter's best allowed token. Copied: drafts taken from "
     "the grammar's jump-forward text or the request's own prompt / output. Right axis: the share of "
     "request-steps under a grammar.",
     [(rate("sglang:dspark_grammar_request_steps_total"), "grammar request-steps/s"),
      (rate("sglang:dspark_grammar_forced_drafts_total"), "forced drafts/s"),
      (rate("sglang:dspark_grammar_replaced_drafts_total"), "replaced drafts/s"),
      (rate("sglang:dspark_grammar_copied_drafts_total"), "copied drafts/s (jump-forward, lookup)"),
      (f"{rate('sglang:dspark_grammar_request_steps_total')} / {rate('sglang:dspark_verify_steps_total')}",
       "share under a grammar")],
     {"right_axis": ["share under a grammar"]}),
    ("Acceptance by source", "percentunit",
     "Where each request-step's verified drafts came from: the DSpark drafter, prompt/output lookup, the "
     "cross-request n-gram corpus or the n-gram table of the target's answers. Solid: accepted / verified draft tokens per source. Dashed: the share of all "
     "request-steps whose drafts came from the source (the rest had nothing proposed, or fell back).",
     [(f"{rate('sglang:dspark_accepted_tokens_by_source_total', by='source')} / "
       f"{rate('sglang:dspark_verified_tokens_by_source_total', by='source')}", "accepted / verified {{source}}"),
      (f"{rate('sglang:dspark_request_steps_by_source_total', by='source')} / on() group_left() "
       f"{rate('sglang:dspark_verify_steps_total')}", "share of request-steps {{source}}")],
     {"dashed": "share"}),
    ("Retrieval confidence ECE", "none",
     "Expected calibration error of each retrieval source's calibrated draft confidences per draft position "
     "(prompt/output lookup, cross-request corpus, n-gram table); no data until retrieval drafts are served. Dashed: its "
     "label-noise floor, the ECE a perfectly calibrated source would show on the same predictions.",
     [(f"max by (source, position) (avg_over_time(sglang:dspark_retrieval_ece{{{SEL}}}[{RI}]))",
       "{{source}} p{{position}}"),
      (f"max by (source, position) (avg_over_time(sglang:dspark_retrieval_ece_floor{{{SEL}}}[{RI}]))",
       "floor {{source}} p{{position}}")], {"dashed": "floor"}),
    ("Retrieval confidence ECE since start-up", "none",
     "The same ECE over every retrieval prediction verified since the server started (the panel above reads the "
     "last 1024 per position, whose noise floor alone is ~3%). Dashed: its label-noise floor, which falls as "
     "1 / sqrt(predictions). Right axis: the predictions per source and position the reading is over.",
     [(f"max by (source, position) (sglang:dspark_retrieval_ece_served{{{SEL}}})", "{{source}} p{{position}}"),
      (f"max by (source, position) (sglang:dspark_retrieval_ece_served_floor{{{SEL}}})",
       "floor {{source}} p{{position}}"),
      (f"sum by (source, position) (sglang:dspark_retrieval_predictions{{{SEL}}})",
       "predictions {{source}} p{{position}}")],
     {"dashed": "floor", "right_axis": ["predictions"]}),
    ("Draft and verify time per step", "s",
     "Mean drafter and target-verify time per decode step, and their p95.",
     [(f"{rate('sglang:dspark_draft_time_seconds_sum')} / {rate('sglang:dspark_draft_time_seconds_count')}",
       "draft (mean)"),
      (f"{rate('sglang:dspark_verify_time_seconds_sum')} / {rate('sglang:dspark_verify_time_seconds_count')}",
       "verify (mean)"),
      (f"histogram_quantile(0.95, {rate('sglang:dspark_verify_time_seconds_bucket', by='le')})", "verify (p95)")],
     {}),
    ("Verify tokens per batch", "short",
     "Tokens in one target verify forward (sum over requests of 1 + l_r): mean and p95.",
     [(f"{rate('sglang:dspark_batch_verify_tokens_sum')} / {rate('sglang:dspark_batch_verify_tokens_count')}",
       "mean"),
      (f"histogram_quantile(0.95, {rate('sglang:dspark_batch_verify_tokens_bucket', by='le')})", "p95")], {}),
    ("Accept and verify length per request-step", "none",
     "Distribution of accepted drafts and verify length l_r per request per step (p50 / p90).",
     [(f"histogram_quantile(0.5, {rate('sglang:dspark_accept_length_bucket', by='le')})", "accepted p50"),
      (f"histogram_quantile(0.9, {rate('sglang:dspark_accept_length_bucket', by='le')})", "accepted p90"),
      (f"histogram_quantile(0.5, {rate('sglang:dspark_verify_length_bucket', by='le')})", "verify length p50"),
      (f"histogram_quantile(0.9, {rate('sglang:dspark_verify_length_bucket', by='le')})", "verify length p90")],
     {}),
]


def _overrides(legends: list[str], opts: dict) -> list[dict]:
    out = []
    for name in opts.get("right_axis", []):
        out.append({"matcher": {"id": "byName", "options": name},
                    "properties": [{"id": "custom.axisPlacement", "value": "right"}]})
    if "dashed" in opts:
        out.append({"matcher": {"id": "byRegexp", "options": f"^{opts['dashed']}.*"},
                    "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}]})
    return out


def timeseries(pid: int, title: str, unit: str, desc: str, targets, opts: dict, pos: dict) -> dict:
    return {
        "id": pid, "type": "timeseries", "title": title, "description": desc, "datasource": DATASOURCE,
        "gridPos": pos,
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"drawStyle": "line", "lineWidth": 2, "fillOpacity": 5,
                                                              "showPoints": "never", "spanNulls": True}},
                        "overrides": _overrides([t[1] for t in targets], opts)},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "none"}},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend,
                     "range": True, "instant": False}
                    for i, (expr, legend) in enumerate(targets)],
    }


def controller_table(pid: int, pos: dict) -> dict:
    return {
        "id": pid, "type": "table", "title": "Controller and drafter",
        "description": "sglang:dspark_controller_info: verify-length controller, gamma and drafter per instance.",
        "datasource": DATASOURCE, "gridPos": pos,
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True},
        "transformations": [{"id": "organize", "options": {
            "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "engine_type": True},
            "renameByName": {}}}],
        "targets": [{"refId": "A", "datasource": DATASOURCE, "format": "table", "instant": True, "range": False,
                     "expr": f"max by (instance, model_name, controller, gamma, drafter) "
                             f"(sglang:dspark_controller_info{{{SEL}}})", "legendFormat": "__auto"}],
    }


def variable(name: str, label: str, query: str) -> dict:
    return {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
            "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "hide": 0}


def build() -> dict:
    panels = [controller_table(1, {"x": 0, "y": 0, "w": 24, "h": 4})]
    for i, (title, unit, desc, targets, opts) in enumerate(PANELS):
        pos = {"x": 12 * (i % 2), "y": 4 + 8 * (i // 2), "w": 12, "h": 8}
        panels.append(timeseries(i + 2, title, unit, desc, targets, opts, pos))
    return {
        "uid": UID, "title": "SGLang DSpark speculative decoding", "tags": ["sglang", "dspark", "speculative"],
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1, "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"}, "timepicker": {}, "timezone": "browser",
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "options": [], "refresh": 1, "regex": ""},
            variable("instance", "Instance", "label_values(sglang:dspark_controller_info, instance)"),
            variable("model", "Model",
                     'label_values(sglang:dspark_controller_info{instance=~"$instance"}, model_name)'),
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}")
