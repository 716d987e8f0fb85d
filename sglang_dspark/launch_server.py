"""`python -m sglang_dspark.launch_server [SGLang flags...]`: SGLang's server with DSpark on and sane defaults.

Every SGLang flag passes through unchanged; we only fill in what the user left out: the embedded model, the shipped
drafter with DSPARK_EXT, and on a machine without a GPU the CPU engine with a bounded KV cache and a scheduler that
sleeps while idle instead of spinning on a core.

Speculation: none given (or `--speculative-algorithm DSPARK_EXT`) = DSPARK_EXT with the shipped drafter unless
`--speculative-draft-model-path` names another; `--no-dspark` or `--speculative-algorithm NONE` = SGLang's plain
decoding; any other SGLang algorithm (NGRAM, STANDALONE, ...) runs as SGLang's own, with nothing of DSPARK_EXT
added (on CPU only the `intel_amx` attention backend, which SGLang's verify needs). An algorithm SGLang cannot run
on this device is refused with its reason before SGLang starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR
from sglang_dspark.sglang_plugin.options import ALGORITHM_NAME

CPU_MAX_TOTAL_TOKENS = 32768
ALGORITHM_FLAG = "--speculative-algorithm"
# SGLang 0.5.23 builtins whose server-arg check refuses a CPU device (speculative_hook._handle_dspark / _dflash /
# UNO's handler); refused here in a line instead of after SGLang's imports (~15 s) with a traceback.
CPU_REFUSED_ALGORITHMS = {
    "DSPARK": f"SGLang's builtin DSpark runs on CUDA, NPU or XPU only; this package's DSpark is {ALGORITHM_NAME}, "
              f"the launcher's default (leave --speculative-algorithm out or pass {ALGORITHM_NAME})",
    "DFLASH": "SGLang's DFLASH runs on CUDA, NPU or XPU only",
    "UNO": "SGLang's UNO runs on CUDA only",
}
# The CPU attention backend for SGLang's own speculative algorithms: torch_native has no TARGET_VERIFY / draft
# support, intel_amx does (on a CPU without AMX through patches/sglang_keep_amx_backend.diff and the sgl_kernel
# stand-in's attention ops). DSPARK_EXT verifies as an EXTEND batch and keeps torch_native.
CPU_SPEC_ATTENTION_BACKEND = "intel_amx"


def _has_flag(argv: list[str], *names: str) -> bool:
    return any(a == n or a.startswith(n + "=") for a in argv for n in names)


def _flag_value(argv: list[str], name: str) -> str | None:
    """The flag's value; the last one when given twice, as argparse takes it."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def _without_flag(argv: list[str], name: str) -> list[str]:
    """argv with every `name VALUE` / `name=VALUE` removed."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


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

    algo = _flag_value(argv, ALGORITHM_FLAG)
    if algo is not None and algo.upper() == "NONE":
        # = --no-dspark. SGLang 0.5.23 keeps the string "NONE", which its tokenizer manager reads as speculation
        # on, and the first finished request dies in _calculate_spec_decoding_metrics (IndexError).
        argv = _without_flag(argv, ALGORITHM_FLAG)
        algo, no_dspark = None, True
    user_draft = _has_flag(argv, "--speculative-draft-model-path")
    on_cpu = not cuda and (_flag_value(argv, "--device") or "cpu") == "cpu"
    if no_dspark:
        if algo is not None:
            raise SystemExit(f"sglang_dspark: --no-dspark conflicts with {ALGORITHM_FLAG} {algo}")
    elif algo is None:
        if _dspark_available(user_draft):
            argv += [ALGORITHM_FLAG, ALGORITHM_NAME]
            if not user_draft:
                argv += ["--speculative-draft-model-path", str(DEFAULT_DRAFTER_DIR)]
    elif algo.upper() == ALGORITHM_NAME:  # explicit = the default
        if not user_draft:
            if not (DEFAULT_DRAFTER_DIR / "config.json").exists():
                raise SystemExit(f"sglang_dspark: {ALGORITHM_NAME} needs --speculative-draft-model-path (the shipped "
                                 f"drafter {DEFAULT_DRAFTER_DIR} has no config.json)")
            argv += ["--speculative-draft-model-path", str(DEFAULT_DRAFTER_DIR)]
    elif on_cpu and algo.upper() in CPU_REFUSED_ALGORITHMS:
        raise SystemExit(f"sglang_dspark: {ALGORITHM_FLAG} {algo} cannot run on this CPU: "
                         f"{CPU_REFUSED_ALGORITHMS[algo.upper()]}")
    sglang_spec = algo is not None and algo.upper() != ALGORITHM_NAME  # SGLang's own algorithm: nothing of ours
    draft = _flag_value(argv, "--speculative-draft-model-path")
    if draft:
        err = _check_model_dir("drafter path", draft)
        if err:
            raise SystemExit(f"sglang_dspark: {err}")

    if on_cpu:
        if not _has_flag(argv, "--device"):
            argv += ["--device", "cpu"]
        if not _has_flag(argv, "--max-total-tokens", "--mem-fraction-static"):
            argv += ["--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS)]
        if not _has_flag(argv, "--attention-backend"):
            argv += ["--attention-backend", CPU_SPEC_ATTENTION_BACKEND if sglang_spec else "torch_native"]
        if not _has_flag(argv, "--sleep-on-idle"):
            # SGLang's idle scheduler otherwise polls its sockets in a loop: a whole core of a 2-core machine burnt
            # while no request is in, taken from the other servers and jobs on it; the sleeper wakes on a message
            argv += ["--sleep-on-idle"]
    if not _has_flag(argv, "--host"):
        argv += ["--host", "127.0.0.1"]
    if not _has_flag(argv, "--port"):
        argv += ["--port", "30000"]
    return argv


def _dspark_available(user_draft: bool = False) -> bool:
    """DSPARK_EXT can be the default: a drafter (the user's or the shipped one) and the plugin importable."""
    if not user_draft and not (DEFAULT_DRAFTER_DIR / "config.json").exists():
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
    from sglang_dspark.cpu_features import has_native_bf16

    dtype = _resolved_dtype(argv, _flag_value(argv, "--model-path") or _flag_value(argv, "--model"))
    if dtype not in ("bfloat16", "bf16") or not cpu_flags or has_native_bf16(cpu_flags):
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
    algo = (_flag_value(argv, ALGORITHM_FLAG) or "").upper()
    if algo != ALGORITHM_NAME or "--dspark-no-profile" in argv or _has_flag(argv, "--dspark-cost-model-path"):
        return False
    from sglang_dspark.sglang_plugin.cost_profile import cache_path, cost_key, verify_attention_kind
    from sglang_dspark.sglang_plugin.cpu_gemm import cost_tag, predicted_gemm_kind
    from sglang_dspark.sglang_plugin.options import DSparkOptions

    model = _flag_value(argv, "--model-path") or _flag_value(argv, "--model")
    dtype = _resolved_dtype(argv, model)
    attention = verify_attention_kind(_flag_value(argv, "--attention-backend"),
                                      "--dspark-sglang-verify-attention" not in argv)
    gemm = predicted_gemm_kind(_flag_value(argv, "--dspark-cpu-gemm") or "auto", _cpu_flags() or None, dtype, cuda)
    gemm = cost_tag(gemm, int(_flag_value(argv, "--dspark-cpu-gemm-rows") or DSparkOptions().cpu_gemm_rows))
    key = cost_key(model, f"torch.{dtype}", "cuda" if cuda else "cpu", attention, gemm)
    return not cache_path(key).exists()


def cpu_thread_binds(argv: list[str], cores: list[int]) -> str | None:
    """SGLANG_CPU_OMP_THREADS_BIND for tp x dp CPU ranks ("0|1", "0-3|4-7"): SGLang's CPU engine asserts that
    tp * dp fits the NUMA nodes unless it is given one core set per rank. None for a single rank."""
    def size(flag: str, short: str | None = None) -> int:
        v = _flag_value(argv, flag) or (_flag_value(argv, short) if short else None)
        return int(v) if v else 1

    ranks = size("--tp-size", "--tp") * size("--dp-size", "--dp")
    if ranks <= 1:
        return None
    cores = sorted(cores)
    if len(cores) < ranks:
        raise SystemExit(f"sglang_dspark: {ranks} CPU ranks (tp x dp) need at least {ranks} cores, this process may "
                         f"use {len(cores)}")
    per = len(cores) // ranks
    groups = [cores[i * per:(i + 1) * per] for i in range(ranks)]
    return "|".join(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in groups)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cuda = _cuda_available()
    if not cuda:
        # SGLang reads this at import time to select its CPU engine.
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sglang_argv = build_argv(argv, cuda)
    helping = "-h" in sglang_argv or "--help" in sglang_argv
    if not cuda and not helping and "SGLANG_CPU_OMP_THREADS_BIND" not in os.environ:
        binds = cpu_thread_binds(sglang_argv, sorted(os.sched_getaffinity(0)))
        if binds:
            os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = binds
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
    refused = None
    try:
        run_server(server_args)
    except ValueError as e:
        if not getattr(server_args, "_resolution_failed", False):
            raise  # not SGLang's argument resolution: keep the traceback
        refused = e  # SGLang (or DSPARK_EXT's validate_server_args) refused the arguments; nothing started yet
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    if refused is not None:  # the reason as the last line, after kill_process_tree's log line
        print(f"sglang_dspark: SGLang refused the server arguments: {refused}", file=sys.stderr, flush=True)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
