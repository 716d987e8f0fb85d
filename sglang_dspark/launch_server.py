"""`python -m sglang_dspark.launch_server [SGLang flags...]`: SGLang's server with DSpark on and sane defaults.

Every SGLang flag passes through unchanged; we only fill in what the user left out: the embedded model, the shipped
drafter with DSPARK_EXT, and on a machine without a GPU the CPU engine with a bounded KV cache.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR
from sglang_dspark.sglang_plugin.options import ALGORITHM_NAME

CPU_MAX_TOTAL_TOKENS = 32768


def _has_flag(argv: list[str], *names: str) -> bool:
    return any(a == n or a.startswith(n + "=") for a in argv for n in names)


def _flag_value(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _check_model_dir(kind: str, path: str) -> str | None:
    p = Path(path)
    if not p.exists():
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            return f"{kind} '{path}' does not exist (and HF_HUB_OFFLINE=1: no hub download)"
        return None  # a hub id; SGLang resolves it
    if not p.is_dir():
        return f"{kind} '{path}' is not a directory"
    if not (p / "config.json").is_file():
        return f"{kind} '{path}' has no config.json"
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        return f"{kind} '{path}' has no weight files (*.safetensors)"
    return None


def build_argv(argv: list[str], cuda: bool) -> list[str]:
    """Fill in defaults; return SGLang's argv. Raises SystemExit with a one-line reason on bad paths."""
    argv = list(argv)
    no_dspark = "--no-dspark" in argv
    argv = [a for a in argv if a != "--no-dspark"]
    if "-h" in argv or "--help" in argv:
        return argv

    if not _has_flag(argv, "--model-path", "--model"):
        argv += ["--model-path", str(DEFAULT_TARGET_DIR)]
    model = _flag_value(argv, "--model-path") or _flag_value(argv, "--model")
    err = _check_model_dir("model path", model)
    if err:
        raise SystemExit(f"sglang_dspark: {err}")

    algo = _flag_value(argv, "--speculative-algorithm")
    if no_dspark:
        if algo and algo.upper() not in ("NONE",):
            raise SystemExit("sglang_dspark: --no-dspark conflicts with --speculative-algorithm " + algo)
    elif algo is None and _dspark_available():
        argv += ["--speculative-algorithm", ALGORITHM_NAME]
        if not _has_flag(argv, "--speculative-draft-model-path"):
            argv += ["--speculative-draft-model-path", str(DEFAULT_DRAFTER_DIR)]
    draft = _flag_value(argv, "--speculative-draft-model-path")
    if draft:
        err = _check_model_dir("drafter path", draft)
        if err:
            raise SystemExit(f"sglang_dspark: {err}")

    if not cuda:
        if not _has_flag(argv, "--device"):
            argv += ["--device", "cpu"]
        if not _has_flag(argv, "--max-total-tokens", "--mem-fraction-static"):
            argv += ["--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS)]
        if not _has_flag(argv, "--attention-backend"):
            argv += ["--attention-backend", "torch_native"]
    if not _has_flag(argv, "--host"):
        argv += ["--host", "127.0.0.1"]
    if not _has_flag(argv, "--port"):
        argv += ["--port", "30000"]
    return argv


def _dspark_available() -> bool:
    if not (DEFAULT_DRAFTER_DIR / "config.json").exists():
        return False
    try:
        import sglang_dspark.sglang_plugin.registration  # noqa: F401
    except ImportError:
        return False
    return True


def _resolved_dtype(argv: list[str], model: str | None) -> str:
    """--dtype, or for "auto" the model config's dtype (as SGLang resolves it)."""
    dtype = _flag_value(argv, "--dtype") or "auto"
    if dtype != "auto":
        return dtype
    try:
        import json

        cfg = json.loads((Path(model) / "config.json").read_text())
        return cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    except (OSError, TypeError, ValueError):
        return "bfloat16"


def cpu_bf16_note(argv: list[str], cpu_flags: set[str]) -> str | None:
    """A line for serving bf16 on a CPU without native bf16 math, where plain bf16 GEMMs do not batch."""
    from sglang_dspark.sglang_plugin.cpu_gemm import wants_row_dispatch

    dtype = _resolved_dtype(argv, _flag_value(argv, "--model-path") or _flag_value(argv, "--model"))
    if dtype not in ("bfloat16", "bf16") or not wants_row_dispatch("auto", cpu_flags or None):
        return None  # not bf16, flags unknown, or a CPU with native bf16 dot products
    if (_flag_value(argv, "--dspark-cpu-gemm") or "auto") != "off":
        return ("sglang_dspark: this CPU has no native bf16 math (no AVX512-BF16 / AMX): decode and verify GEMMs run "
                "our small-M bf16 kernel, and fp32 copies of the weights take over from a row count measured per "
                "shape at start where they are faster (--dspark-cpu-gemm off keeps SGLang's bf16 GEMMs)")
    return ("sglang_dspark: this CPU has no native bf16 math (no AVX512-BF16 / AMX), so batched bf16 decoding barely "
            "scales here; --dtype float32 served 1.7x the aggregate tok/s at 8 concurrent requests and 0.62x at 1 "
            "on a 2-core AVX2 EPYC (docs/benchmark-log.md, 2026-11-30)")


def _cpu_flags() -> set[str]:
    from sglang_dspark.sglang_plugin.cost_profile import cpuinfo_field

    return set(cpuinfo_field("flags").split())


def _wants_profile_load(argv: list[str], cuda: bool) -> bool:
    """Profile only when DSPARK_EXT is on, profiling is allowed and no cost model is cached for this stack."""
    algo = (_flag_value(argv, "--speculative-algorithm") or "").upper()
    if algo != ALGORITHM_NAME or "--dspark-no-profile" in argv or _has_flag(argv, "--dspark-cost-model-path"):
        return False
    from sglang_dspark.sglang_plugin.cost_profile import cache_path, cost_key, verify_attention_kind
    from sglang_dspark.sglang_plugin.cpu_gemm import predicted_gemm_kind

    model = _flag_value(argv, "--model-path") or _flag_value(argv, "--model")
    dtype = _resolved_dtype(argv, model)
    attention = verify_attention_kind(_flag_value(argv, "--attention-backend"),
                                      "--dspark-sglang-verify-attention" not in argv)
    gemm = predicted_gemm_kind(_flag_value(argv, "--dspark-cpu-gemm") or "auto", _cpu_flags() or None, dtype, cuda)
    key = cost_key(model, f"torch.{dtype}", "cuda" if cuda else "cpu", attention, gemm)
    return not cache_path(key).exists()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cuda = _cuda_available()
    if not cuda:
        # SGLang reads this at import time to select its CPU engine.
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sglang_argv = build_argv(argv, cuda)
    helping = "-h" in sglang_argv or "--help" in sglang_argv
    note = None if cuda or helping else cpu_bf16_note(sglang_argv, _cpu_flags())
    if note:
        print(note, file=sys.stderr, flush=True)

    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(sglang_argv)
    if _wants_profile_load(sglang_argv, cuda):
        from sglang_dspark.profile_warmup import start_in_background

        start_in_background(_flag_value(sglang_argv, "--host"), int(_flag_value(sglang_argv, "--port")))
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
