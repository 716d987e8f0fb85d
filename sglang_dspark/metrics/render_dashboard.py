"""Render the Grafana dashboard's panels from a live Prometheus into one PNG (no Grafana needed).

    python -m sglang_dspark.metrics.render_dashboard --prometheus http://127.0.0.1:9090 --out dspark.png \
        [--minutes 15 | --start UNIX --end UNIX] [--instance REGEX] [--model REGEX] [--rate-interval 1m]

Each panel's PromQL expressions are evaluated over the range through Prometheus's HTTP API (query_range) with the
dashboard variables substituted, and plotted in a grid in the dashboard's panel order.
"""

from __future__ import annotations

import argparse
import json
import math
import time
import urllib.parse
import urllib.request
from pathlib import Path

DEFAULT_DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "sglang-dspark.json"


def substitute(expr: str, instance: str = ".*", model: str = ".*", rate_interval: str = "1m") -> str:
    """The expression as Grafana would send it for these variable values."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$instance", instance)
            .replace("$model", model))


def prom_get(base_url: str, path: str, params: dict, timeout: float = 30.0) -> list[dict]:
    url = f"{base_url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus error for {params.get('query')!r}: {body}")
    return body["data"]["result"]


def query_range(base_url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    return prom_get(base_url, "/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})


def legend(fmt: str, metric: dict) -> str:
    if not fmt or fmt == "__auto":
        return ",".join(f"{k}={v}" for k, v in metric.items()) or "value"
    return fmt.replace("{{", "{").replace("}}", "}").format_map(_Missing(metric))


def _short(value: str, width: int = 60) -> str:
    return value if len(value) <= width else "..." + value[-(width - 3):]


class _Missing(dict):
    def __missing__(self, key):
        return ""


def render(dashboard: dict, base_url: str, out: Path, start: float, end: float, instance: str = ".*",
           model: str = ".*", rate_interval: str = "1m") -> dict[str, int]:
    """Plot every panel; returns {panel title: number of series that had data}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard["panels"]
    step = max(1.0, (end - start) / 300)
    ncols = 2
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 3.2 * nrows), squeeze=False)
    counts: dict[str, int] = {}
    for ax, panel in zip(axes.flat, panels):
        ax.set_title(panel["title"], fontsize=10)
        if panel["type"] == "table":  # label sets at the end of the range, as text
            rows = [series["metric"] for target in panel["targets"] for series in prom_get(
                base_url, "/api/v1/query", {"query": substitute(target["expr"], instance, model, rate_interval),
                                            "time": end})]
            ax.axis("off")
            text = "\n\n".join("\n".join(f"{k}: {_short(v)}" for k, v in r.items()) for r in rows) or "no data"
            ax.text(0.02, 0.95, text, fontsize=8, va="top", family="monospace", transform=ax.transAxes)
            counts[panel["title"]] = len(rows)
            continue
        n = 0
        right = None
        right_names = {o["matcher"]["options"] for o in panel.get("fieldConfig", {}).get("overrides", [])
                       if o["matcher"]["id"] == "byName"}
        for target in panel["targets"]:
            expr = substitute(target["expr"], instance, model, rate_interval)
            for series in query_range(base_url, expr, start, end, step):
                xs = [float(t) - start for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                name = legend(target.get("legendFormat", ""), series["metric"])
                if name in right_names:
                    right = right or ax.twinx()
                    right.plot(xs, ys, label=name, linestyle="--", color="tab:gray")
                    right.legend(fontsize=7, loc="upper right")
                else:
                    ax.plot(xs, ys, label=name, linestyle="--" if name.startswith("predicted") else "-")
                n += 1
        counts[panel["title"]] = n
        ax.set_xlabel("seconds since start", fontsize=8)
        ax.tick_params(labelsize=7)
        if n:
            ax.legend(fontsize=7, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"{dashboard['title']} — {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(end))}")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    ap.add_argument("--out", required=True, type=Path, help="PNG to write")
    ap.add_argument("--dashboard", type=Path, default=DEFAULT_DASHBOARD)
    ap.add_argument("--minutes", type=float, default=15.0, help="range ending now (ignored with --start)")
    ap.add_argument("--start", type=float, help="range start, unix seconds")
    ap.add_argument("--end", type=float, help="range end, unix seconds (default now)")
    ap.add_argument("--instance", default=".*", help="regex for the $instance variable")
    ap.add_argument("--model", default=".*", help="regex for the $model variable")
    ap.add_argument("--rate-interval", default="1m", help="value for $__rate_interval")
    args = ap.parse_args(argv)
    end = args.end or time.time()
    start = args.start or end - 60 * args.minutes
    counts = render(json.loads(args.dashboard.read_text()), args.prometheus, args.out, start, end, args.instance,
                    args.model, args.rate_interval)
    empty = [t for t, n in counts.items() if n == 0]
    print(f"wrote {args.out}: {len(counts)} panels" + (f"; no data: {empty}" if empty else ""))


if __name__ == "__main__":
    main()
