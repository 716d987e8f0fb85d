"""Start a real SGLang HTTP server as a subprocess for tests (CPU engine by default).

    with SGLangServer(["--model-path", str(model), "--attention-backend", "torch_native"]) as srv:
        requests.get(srv.url + "/health")

The server runs in its own process group; on exit the whole group (launcher,
scheduler, detokenizer) is terminated, then killed if it lingers. Its output
goes to a log file whose tail is included in any startup error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from sglang_dspark.bench.server import free_port

CPU_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",  # sglang's own switch for the CPU platform
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# Flags every CPU test server needs; callers add the model and backend.
CPU_ARGS = ["--device", "cpu", "--max-total-tokens", "8192", "--skip-server-warmup", "--host", "127.0.0.1"]


class SGLangServer:
    """Context manager around `python -m sglang.launch_server`.

    args: extra CLI args (model path, backend, spec flags, ...); CPU_ARGS and
    --port are added unless `cpu_defaults=False`. env: extra environment on top
    of os.environ + CPU_ENV. log_path: where stdout/stderr go (a temp file if None).
    """

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        *,
        port: int | None = None,
        startup_timeout: float = 240.0,
        log_path: str | Path | None = None,
        cpu_defaults: bool = True,
        python: str = sys.executable,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout = startup_timeout
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="sglang_server_", suffix=".log")[1])
        self.cmd = [python, "-m", "sglang.launch_server", *(CPU_ARGS if cpu_defaults else []), *args, "--port", str(self.port)]
        self.env = {**os.environ, **(CPU_ENV if cpu_defaults else {}), **(env or {})}
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "SGLangServer":
        self._log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.cmd, env=self.env, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with code {self.proc.returncode}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"SGLang server not healthy after {self.startup_timeout:.0f}s\n{self.log_tail()}")

    def stop(self, grace: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            pgid = self.proc.pid  # start_new_session: the group id is the launcher's pid
            self._signal_group(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            self._signal_group(pgid, signal.SIGKILL)  # children may outlive the launcher
            self.proc.wait(timeout=10)
        elif self.proc is not None:
            self._signal_group(self.proc.pid, signal.SIGKILL)  # orphans of a dead launcher
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers
    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])
