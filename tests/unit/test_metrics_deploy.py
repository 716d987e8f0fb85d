"""deploy/: compose files (GPU and CPU) parse and wire SGLang -> Prometheus -> Grafana consistently; the
Prometheus config is valid (promtool); Grafana provisioning points at the dashboard. Docker itself is not run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE_FILES = ["docker-compose.yml", "docker-compose.cpu.yml"]


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_stack(name):
    compose = load(name)
    services = compose["services"]
    assert {"sglang", "prometheus", "grafana"} <= set(services)
    sglang = services["sglang"]
    cmd = [str(a) for a in sglang["command"]]
    assert "sglang_dspark.launch_server" in cmd and "--enable-metrics" in cmd
    assert cmd[cmd.index("--port") + 1] == "30000" and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert sglang["environment"]["SGLANG_PLUGINS"] == "dspark_ext"
    assert (DEPLOY / sglang["build"]["context"] / sglang["build"]["dockerfile"]).is_file()
    # every bind mount of a ./ path exists in deploy/
    for svc in services.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("./"):
                assert (DEPLOY / src).exists(), f"{name}: missing {src}"
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in services["prometheus"]["volumes"]
    mounts = services["grafana"]["volumes"]
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in mounts
    if name == "docker-compose.yml":  # the GPU variant asks for a GPU
        devices = sglang["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]


def test_prometheus_scrapes_the_compose_sglang_service():
    cfg = load("prometheus.yml")
    targets = [t for job in cfg["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert "sglang:30000" in targets
    assert cfg["scrape_configs"][0]["metrics_path"] == "/metrics"
    # whatever name escaping the scrape negotiates, series end up under SGLang's canonical sglang:... names
    rule = cfg["scrape_configs"][0]["metric_relabel_configs"][0]
    assert rule["source_labels"] == ["__name__"] and rule["target_label"] == "__name__"
    assert rule["regex"] == "sglang_(.+)" and rule["replacement"] == "sglang:$1"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (scripts/install_prometheus.sh)")
def test_prometheus_config_is_valid():
    out = subprocess.run(["promtool", "check", "config", str(DEPLOY / "prometheus.yml")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_grafana_provisioning():
    ds = load("grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    provider = load("grafana/provisioning/dashboards/dspark.yml")["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (DEPLOY / "grafana" / "dashboards" / "sglang-dspark.json").is_file()


def test_replicas_stack_scrapes_every_replica_and_the_router():
    compose = load("docker-compose.replicas.yml")
    services = compose["services"]
    replicas = [n for n in services if n.startswith("replica")]
    assert len(replicas) >= 2
    for n in replicas:
        cmd = [str(a) for a in services[n]["command"]]
        assert "sglang_dspark.launch_server" in cmd and "--enable-metrics" in cmd
        assert cmd[cmd.index("--port") + 1] == "30000"
    router = [str(a) for a in services["router"]["command"]]
    assert "sglang_router.launch_router" in router
    urls = router[router.index("--worker-urls") + 1: router.index("--policy")]
    assert urls == [f"http://{n}:30000" for n in replicas]
    assert "./prometheus.replicas.yml:/etc/prometheus/prometheus.yml:ro" in services["prometheus"]["volumes"]
    cfg = load("prometheus.replicas.yml")
    jobs = {j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]] for j in cfg["scrape_configs"]}
    assert jobs["sglang"] == [f"{n}:30000" for n in replicas]
    assert jobs["sglang-router"] == [f"router:{router[router.index('--prometheus-port') + 1]}"]
    assert cfg["scrape_configs"][0]["metric_relabel_configs"] == load("prometheus.yml")["scrape_configs"][0][
        "metric_relabel_configs"]
