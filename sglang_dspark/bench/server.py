"""Start and stop a real SGLang server (through our launcher) as a subprocess, for benchmarks and tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


# Below SGLang's own pick for ports a child binds later (22000-29999) and below the kernel's ephemeral range: a port
# from bind(0) is an ephemeral one, and a client polling /health from an ephemeral port can land on it (a TCP
# self-connect), after which the server's bind fails and uvicorn exits with 3 (seen once in CI).
PORT_RANGE = (12000, 21999)


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    for host in ("0.0.0.0", "127.0.0.1"):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A free TCP port that no outgoing connection on this host can be handed."""
    low, high = PORT_RANGE[0], min(PORT_RANGE[1], _ephemeral_low() - 1)
    candidates = list(range(low, high + 1))
    random.shuffle(candidates)
    for port in candidates[:256]:
        if _bindable(port):
            return port
    with socket.socket() as s:  # a host whose whole low range is taken: an ephemeral port beats none
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`with ServerProcess([...flags]) as srv: srv.base_url` — flags go to `sglang_dspark.launch_server`."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, log_path: str | Path | None = None,
                 startup_timeout_s: float = 300.0, port: int | None = None, module: str = "sglang_dspark.launch_server"):
        self.port = port or free_port()
        self.args = list(args) + ["--host", "127.0.0.1", "--port", str(self.port)]
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "SGLANG_USE_CPU_ENGINE": "1", **(env or {})}
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/sglang_dspark_server_{self.port}.log")
        self.startup_timeout_s = startup_timeout_s
        self.module = module
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServerProcess":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, *self.args], env=self.env,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + self.startup_timeout_s
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log tail:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except Exception:
                pass
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"server not healthy after {self.startup_timeout_s}s; log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        self.proc = None
        self._log.close()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
