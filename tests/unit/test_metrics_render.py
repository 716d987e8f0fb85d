"""render_dashboard against a fake Prometheus HTTP API: every panel's expressions are queried (variables
substituted) and drawn; the table panel becomes text."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from sglang_dspark.metrics.render_dashboard import DEFAULT_DASHBOARD, legend, render, substitute  # noqa: E402


class FakePrometheus(BaseHTTPRequestHandler):
    queries: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server API)
        url = urllib.parse.urlparse(self.path)
        params = urllib.parse.parse_qs(url.query)
        FakePrometheus.queries.append(params["query"][0])
        if url.path == "/api/v1/query_range":
            start, step = float(params["start"][0]), float(params["step"][0])
            result = [{"metric": {"position": "1"}, "values": [[start + i * step, str(0.5 + i)] for i in range(5)]}]
        else:
            result = [{"metric": {"controller": "dspark", "gamma": "4"}, "value": [0, "1"]}]
        body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakePrometheus.queries = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_render_queries_every_expression(prometheus, tmp_path: Path):
    dashboard = json.loads(DEFAULT_DASHBOARD.read_text())
    out = tmp_path / "d.png"
    counts = render(dashboard, prometheus, out, start=1000.0, end=1600.0, instance="host:1", rate_interval="30s")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert counts == {p["title"]: len(p["targets"]) for p in dashboard["panels"]}  # one fake series per query
    wanted = [substitute(t["expr"], "host:1", ".*", "30s") for p in dashboard["panels"] for t in p["targets"]]
    assert FakePrometheus.queries == wanted
    assert all("$" not in q for q in FakePrometheus.queries)


def test_legend_format():
    assert legend("position {{position}}", {"position": "3"}) == "position 3"
    assert legend("{{missing}} x", {}) == " x"
    assert legend("__auto", {"a": "1"}) == "a=1"
