"""The Grafana dashboard JSON: up to date with its generator, structurally what Grafana needs, every expression
filtered by the instance/model variables, referencing only metrics we (or SGLang) export, and valid PromQL."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_dspark.metrics.prometheus import metric_names

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "sglang-dspark.json"
# SGLang's own series the dashboard uses (checked live by tests/integration/test_prometheus_scrape.py)
SGLANG_METRICS = {"sglang:generation_tokens_total", "sglang:request_time_per_output_token_seconds_count",
                  "sglang:request_time_per_output_token_seconds_sum"}
METRIC_RE = re.compile(r"\b(sglang:[a-zA-Z0-9_:]+)")
REQUIRED_PANEL_TITLES = ["Tau", "Acceptance rate by draft position", "Verify budget per request vs running requests",
                         "Wasted verify tokens/s", "Aggregate vs per-user tokens/s",
                         "Calibration: predicted vs realised",
                         "Cost model", "Fallbacks", "Acceptance by source", "Retrieval confidence ECE"]


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def concrete(expr: str, interval: str = "1m") -> str:
    """The expression as Grafana sends it with All selected."""
    return expr.replace("$__rate_interval", interval).replace("$instance", ".*").replace("$model", ".*")


def test_json_matches_generator():
    spec = importlib.util.spec_from_file_location("make_dashboard", REPO / "deploy" / "grafana" / "make_dashboard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert DASHBOARD.read_text() == mod.render(), "run: python deploy/grafana/make_dashboard.py"


def test_top_level_fields(dashboard):
    for key in ("uid", "title", "schemaVersion", "panels", "templating", "time", "version"):
        assert key in dashboard, key
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", dashboard["uid"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "instance", "model"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "model"):
        var = variables[name]
        assert var["type"] == "query" and var["includeAll"] and var["allValue"] == ".*"
        assert var["query"]["query"].startswith("label_values(")


def test_panels_are_well_formed_and_do_not_overlap(dashboard):
    ids, cells = set(), set()
    for panel in dashboard["panels"]:
        assert panel["id"] not in ids
        ids.add(panel["id"])
        assert panel["type"] in {"timeseries", "table", "stat", "gauge", "heatmap", "bargauge"}
        assert panel["title"] and panel.get("description")
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("x", "y", "w", "h"))
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"panel {panel['title']!r} overlaps another"
                cells.add((x, y))
        targets = panel["targets"]
        assert targets
        ref_ids = [t["refId"] for t in targets]
        assert len(set(ref_ids)) == len(ref_ids)
        for t in targets:
            assert t["expr"].strip() and t["datasource"] == panel["datasource"]


def test_required_panels_present(dashboard):
    titles = [p["title"] for p in dashboard["panels"]]
    for want in REQUIRED_PANEL_TITLES:
        assert any(t.startswith(want) for t in titles), f"no panel {want!r} in {titles}"


def test_every_expression_is_filtered_and_uses_exported_metrics(dashboard):
    exported = set(metric_names()) | SGLANG_METRICS
    for expr in expressions(dashboard):
        used = set(METRIC_RE.findall(expr))
        assert used, expr
        assert used <= exported, f"unknown metrics {used - exported} in {expr}"
        for selector in re.findall(r"sglang:[a-zA-Z0-9_:]+(\{[^}]*\})?", expr):
            assert 'instance=~"$instance"' in selector and 'model_name=~"$model"' in selector, expr
    # every family we export is on the dashboard somewhere (histograms through any of their series)
    text = " ".join(expressions(dashboard))
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in metric_names()}
    unused = [f for f in families if f not in text]
    assert not unused, f"exported but not on the dashboard: {unused}"


def test_acceptance_by_source_panel(dashboard):
    """Accepted / verified draft tokens and the request-step share, each as one series per source."""
    (panel,) = [p for p in dashboard["panels"] if p["title"] == "Acceptance by source"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    ratio, share = panel["targets"]
    for expr, num, den in ((ratio["expr"], "accepted_tokens_by_source_total", "verified_tokens_by_source_total"),
                           (share["expr"], "request_steps_by_source_total", "verify_steps_total")):
        left, right = expr.split(" / ", 1)
        assert left.startswith("sum by (source)(rate(sglang:dspark_" + num + "{"), expr
        assert "sglang:dspark_" + den + "{" in right, expr
    assert "by (source)" in ratio["expr"].split(" / ", 1)[1]  # matched per source
    assert "on() group_left()" in share["expr"]  # every source over all request-steps
    assert "{{source}}" in ratio["legendFormat"] and "{{source}}" in share["legendFormat"]
    (ece,) = [p for p in dashboard["panels"] if p["title"] == "Retrieval confidence ECE"]
    assert ece["targets"][0]["expr"].startswith("max by (source, position) (avg_over_time(sglang:dspark_retrieval_ece{")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (scripts/install_prometheus.sh)")
def test_expressions_are_valid_promql(dashboard, tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": concrete(e)} for i, e in enumerate(expressions(dashboard))]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
