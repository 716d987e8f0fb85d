"""DSpark statistics: the per-request record (request_stats) and Prometheus metrics (prometheus).

Importing this package does not import prometheus_client; that happens when metrics are created.
"""

from .prometheus import DSparkMetrics, metric_names, on_request_meta_info

__all__ = ["DSparkMetrics", "metric_names", "on_request_meta_info"]
