"""Shared fixtures of the DSPARK_EXT integration tests: tiny models built once per test run, real servers.

Models (built once per test run, in a tmp dir):
  tiny    : 4-layer fp32 qwen2 with random weights + a random DSpark drafter (block 4).
  bigram  : the same target with attention/MLP outputs zeroed (logits depend on the current token only) and an
            untied lm_head that restricts every transition to a 12-token support, so the exact distribution of a
            3-token continuation has a few hundred cells carrying > 90 % of the mass. Matching drafters with
            noise 0 (always right) and 0.5 (partly right) are built from it.

Servers go through our launcher (`python -m sglang_dspark.launch_server`), each in its own process group, which is
killed as a whole on stop, so no scheduler/detokenizer outlives a test. Starts are the expensive part (~20-40 s),
so the modules keep them few.

Sizes (env, for heavier local runs): DSPARK_IT_PROMPTS (greedy prompts, default 24), DSPARK_IT_TOKENS (greedy
max_new_tokens, default 24), DSPARK_IT_SAMPLES (T=1 samples, default 20000).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from sglang_dspark.bench.server import free_port

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NUM_PROMPTS = int(os.environ.get("DSPARK_IT_PROMPTS", "24"))
GREEDY_TOKENS = int(os.environ.get("DSPARK_IT_TOKENS", "24"))
NUM_SAMPLES = int(os.environ.get("DSPARK_IT_SAMPLES", "20000"))

BLOCK = 4  # drafter block size = gamma
BIGRAM_SUPPORT = 12
COMMON_ARGS = ["--dtype", "float32", "--max-total-tokens", "8192", "--skip-server-warmup",
               "--attention-backend", "torch_native", "--device", "cpu", "--log-level", "info"]
SERVER_ENV = {"SGLANG_PLUGINS": "dspark_ext", "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1",
              "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

# Varied lengths and content; the tokenizer was trained on this kind of text.
PROMPT_POOL = [
    "def add(a, b):", "The quick brown fox", "Hello, world! How", "class Point:", "1 2 3 4 5",
    "What is the capital of France?", "Pack my box with five dozen liquor jugs.", "import json\n",
    "Speculative decoding drafts several tokens", "    return a + b", "self.x = x", "I am fine, thank you.",
    "3.14159 2.71828", "def __init__(self, x, y):", "The lazy dog", "argparse", "Paris.", "json.decoder",
    "How are you today?", "class Decoder(object):", "x", "def", "Hello", "The target model verify them in one pass",
]


def prompts(n: int) -> list[str]:
    return [PROMPT_POOL[i % len(PROMPT_POOL)] + ("" if i < len(PROMPT_POOL) else f" {i}") for i in range(n)]


# ---------------------------------------------------------------------------------------------------- servers
def _free_port() -> int:
    return free_port()


class Server:
    """One `sglang_dspark.launch_server` process group. start() waits for /health or the process's exit."""

    def __init__(self, name: str, args: list[str], env: dict[str, str] | None, log_dir: Path):
        self.name = name
        self.port = _free_port()
        self.cmd = [sys.executable, "-m", "sglang_dspark.launch_server", *args,
                    "--host", "127.0.0.1", "--port", str(self.port)]
        self.env = {**os.environ, **SERVER_ENV, **(env or {})}
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> None:
        log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=REPO)
        log.close()

    def start(self, timeout_s: float = 300.0) -> "Server":
        t0 = time.monotonic()
        self.spawn()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.start_s = time.monotonic() - t0
                        return self
            except Exception:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"server {self.name} not healthy after {timeout_s:.0f}s:\n{self.log_tail()}")

    def wait_exit(self, timeout_s: float = 240.0) -> int:
        """For servers expected to die at startup: their exit code (the group is killed afterwards)."""
        self.spawn()
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return -999
        finally:
            self.stop()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the whole group, give the launcher a grace period, then SIGKILL whatever is left of the group
        (a scheduler or detokenizer can outlive its launcher)."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the launcher's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of every live process in the server's group (launcher, tokenizer,
        scheduler, detokenizer), from /proc."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:  # field 5, pgrp (start_new_session: the launcher's pid)
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / tick

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def dspark_args(model: Path, drafter: Path, controller: str, *extra: str) -> list[str]:
    """A DSPARK_EXT server. Retrieval drafts are off unless `extra` names --dspark-retrieval: most tests check the
    drafter's own accounting (every verified draft the drafter's); test_dspark_retrieval.py turns them on."""
    retrieval = [] if "--dspark-retrieval" in extra else ["--dspark-retrieval", "off"]
    return ["--model-path", str(model), *COMMON_ARGS, "--speculative-algorithm", "DSPARK_EXT",
            "--speculative-draft-model-path", str(drafter), "--dspark-controller", controller,
            "--dspark-no-profile", *retrieval, *extra]  # no start-up cost profiling: it sends its own requests


def plain_args(model: Path) -> list[str]:
    return ["--model-path", str(model), *COMMON_ARGS, "--no-dspark"]


def post_json(url: str, body: dict, timeout: float = 600.0):
    import requests

    r = requests.post(url, json=body, timeout=timeout)
    r.raise_for_status()
    return r.json()


def generate(server: Server, texts: list[str], sampling: dict, timeout: float = 600.0) -> list[dict]:
    out = post_json(server.url + "/generate", {"text": texts, "sampling_params": sampling}, timeout)
    return out if isinstance(out, list) else [out]


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server_logs")


# ---------------------------------------------------------------------------------------------------- models
def make_small_support_bigram(target_dir: Path, support: int = BIGRAM_SUPPORT, spread: float = 0.25,
                              seed: int = 0) -> list[int]:
    """Turn a bigram target (tests/tiny_dspark.make_bigram_target) into one whose transitions all land in a
    `support`-token set S: coordinate 0 of every embedding is 1 (so after RMSNorm it is ~4.3 for every token),
    lm_head rows outside S are -3 * e_0 (logit ~ -13 from any token), rows in S are random in the other coordinates
    (logits ~ N(0, 1.6^2)). The untied lm_head keeps the input embeddings free. Returns S."""
    from safetensors.torch import load_file, save_file

    path = Path(target_dir) / "model.safetensors"
    state = load_file(path)
    emb = state["model.embed_tokens.weight"].clone()
    V, d = emb.shape
    g = torch.Generator().manual_seed(seed)
    S = (torch.randperm(V - 16, generator=g)[:support] + 8).sort().values  # avoid special / byte tokens at 0..7
    emb[:, 0] = 1.0
    head = torch.zeros(V, d)
    head[:, 0] = -3.0
    head[S, 0] = 0.0
    head[S, 1:] = torch.randn(support, d - 1, generator=g) * spread
    state["model.embed_tokens.weight"] = emb.contiguous()
    state["lm_head.weight"] = head.contiguous()
    save_file(state, path, metadata={"format": "pt"})
    cfg_path = Path(target_dir) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tie_word_embeddings"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return S.tolist()


class Models:
    def __init__(self, root: Path):
        from tests.tiny_dspark import build_matching_drafter, build_tiny_drafter, make_bigram_target
        from tests.tiny_model import build_tiny_model

        self.root = root
        self.tiny = build_tiny_model(root / "tiny", dtype="float32", arch="qwen2", layers=4)
        self.tiny_drafter = build_tiny_drafter(self.tiny, root / "tiny_drafter", block_size=BLOCK)
        self.bigram = root / "bigram"
        shutil.copytree(self.tiny, self.bigram)  # same tokenizer, no second BPE training
        make_bigram_target(self.bigram)
        self.support = make_small_support_bigram(self.bigram)
        self.exact_drafter = build_matching_drafter(self.bigram, root / "bigram_drafter_exact", block_size=BLOCK,
                                                    noise=0.0)
        self.noisy_drafter = build_matching_drafter(self.bigram, root / "bigram_drafter_noisy", block_size=BLOCK,
                                                    noise=0.5, seed=3)


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def bigram_random4_server(models, log_dir):
    """Bigram target + noisy matching drafter, controller random:4 (every ragged layout), per-step verify lens
    recorded. Shared by the T=1 distribution test and the API / concurrency tests (adjacent modules)."""
    srv = Server("bigram_noisy_random4", dspark_args(models.bigram, models.noisy_drafter, "random:4",
                                                      "--dspark-record-verify-lens"), None, log_dir)
    with srv:
        yield srv
