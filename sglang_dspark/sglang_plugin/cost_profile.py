"""Engine cost model lifecycle inside the worker: load (file or on-disk cache), else profile, then refine online.

Profiling needs no synthetic batches: for the first PROFILE_STEPS decode steps the worker verifies random lengths
(lossless: the choice ignores draft values), which spreads the verify-token count T across its range, and times
each target forward. Then it fits the robust linear model and caches it keyed by model, dtype, device (for a CPU:
its model and vector ISA) and SGLang version. `python -m sglang_dspark.launch_server` drives a short warm-up load
so this happens before real traffic.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from sglang_dspark.control import EngineCostModel

logger = logging.getLogger(__name__)

PROFILE_STEPS = 96
CACHE_DIR = Path(os.environ.get("SGLANG_DSPARK_CACHE", Path.home() / ".cache" / "sglang_dspark")) / "cost_models"
# Until profiled: roughly a 0.5B model on 2 CPU cores (seconds, s/token, s/request, s/KV token).
PRIOR_COEF = (0.06, 0.004, 0.002, 2e-7)


def cost_key(model_path: str, dtype: str, device: str, verify_attention: str = "sglang", gemm: str = "native",
             tp_size: int = 1) -> dict:
    """verify_attention: which attention code runs verify forwards ("sglang" or "chain-sdpa"); it changes the
    verify cost several-fold on a CPU, so a cost model profiled with one must not be reused for the other. gemm:
    cpu_gemm.engine_cost_tag() (the GEMM kind and its widest calibrated count), named in the key only when it is
    not SGLang's own (older caches stay valid)."""
    import sglang

    key = {"model": os.path.abspath(model_path) if os.path.exists(model_path) else model_path,
           "dtype": str(dtype), "device": str(device), "sglang_version": getattr(sglang, "__version__", "?"),
           "verify_attention": verify_attention}
    if str(device) == "cpu":
        key["cpu"] = cpu_identity()
    if gemm != "native":
        key["gemm"] = gemm
    if tp_size > 1:  # a TP step costs its collectives too
        key["tp_size"] = int(tp_size)
    return key


def cpu_identity() -> str:
    """Which CPU a cost model was measured on. Two 2-core cloud VMs differ several-fold: on an AVX2-only AMD EPYC a
    bf16 GEMM's cost grows linearly with its rows (no native bf16), on an AVX512-BF16 Xeon it barely does below 8
    (BENCHMARKS.md, "CPU GEMM kernel"), so a cache from one must not price the other. Same value in the launcher and the
    scheduler process (no thread counts, which SGLang may set per process)."""
    import torch

    model = cpuinfo_field("model name")
    if not model:
        import platform

        model = platform.processor() or platform.machine()
    return f"{model}; {torch.backends.cpu.get_cpu_capability()}; {os.cpu_count()} cpus"


def cpuinfo_field(name: str) -> str:
    """The first CPU's `name` line of /proc/cpuinfo ("" where there is none, e.g. not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith(name) and ":" in line), "")
    except OSError:
        return ""


def verify_attention_kind(attention_backend: str | None, chain_enabled: bool) -> str:
    """The `verify_attention` part of the cost key: our chain-only attention runs on torch_native only."""
    return "chain-sdpa" if chain_enabled and attention_backend == "torch_native" else "sglang"


def cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return CACHE_DIR / f"{digest}.json"


class CostModelManager:
    def __init__(self, key: dict, explicit_path: str | None, profile: bool, writes_files: bool = True):
        self.key = key
        self.writes_files = writes_files  # under TP only rank 0 writes the profiled model
        self.samples: list[tuple[int, int, int, float]] = []
        self.source = "prior"
        path = Path(explicit_path) if explicit_path else cache_path(key)
        if path.exists():
            # An explicit file is the user's choice; a cache entry must match this exact stack.
            self.model = EngineCostModel.load(path, expected_key=None if explicit_path else key)
            self.model.key = dict(key)
            self.source = str(path)
            self.profile_steps_left = 0
        else:
            if explicit_path:
                raise FileNotFoundError(f"--dspark-cost-model-path {explicit_path} does not exist")
            self.model = EngineCostModel(coef=PRIOR_COEF, key=key)
            self.profile_steps_left = PROFILE_STEPS if profile else 0
        logger.info("DSPARK_EXT cost model: %s (coef=%s)", self.source, self.model.coef)

    @property
    def profiling(self) -> bool:
        return self.profile_steps_left > 0

    def record(self, T: int, R: int, K: int, seconds: float) -> None:
        if not self.profiling:
            return
        self.samples.append((T, R, K, seconds))
        self.profile_steps_left -= 1
        if self.profile_steps_left == 0:
            self._finish_profile()

    def _finish_profile(self) -> None:
        # The first steps include warm-up effects (allocator growth, lazy init); keep the later ones.
        samples = self.samples[len(self.samples) // 8:]
        try:
            self.model.fit(samples)
        except (ValueError, ArithmeticError) as e:
            logger.warning("DSPARK_EXT cost profile fit failed (%s); keeping the prior", e)
            return
        path = cache_path(self.key)
        if self.writes_files:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.model.save(path)
            self.source = str(path)
        logger.info("DSPARK_EXT cost model profiled from %d steps: coef=%s -> %s", len(samples), self.model.coef,
                    path)
