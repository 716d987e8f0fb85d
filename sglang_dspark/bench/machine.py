"""The machine a measurement ran on, as recorded next to every number: CPU model, the SIMD flags that decide the
CPU engine's GEMM path (AVX2 / AVX512-BF16 / AMX), architecture and core count."""

from __future__ import annotations

import os
import platform

_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_model_and_flags(cpuinfo: str | None = None) -> tuple[str, list[str]]:
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return platform.processor() or "unknown CPU", []
    model, flags = "unknown CPU", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, [f for f in _FLAGS if f in flags]


def describe_machine(cpuinfo: str | None = None) -> str:
    """E.g. 'AMD EPYC (avx2), x86_64, 2 cores'."""
    model, flags = cpu_model_and_flags(cpuinfo)
    simd = f" ({', '.join(flags)})" if flags else ""
    return f"{model}{simd}, {platform.machine()}, {os.cpu_count()} cores"
