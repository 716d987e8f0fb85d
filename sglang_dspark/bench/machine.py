"""The machine a measurement ran on, as recorded next to every number: CPU model, the SIMD flags that decide the
CPU engine's GEMM path (AVX2 / AVX512-BF16 / AMX), architecture and core count."""

from __future__ import annotations

import os
import platform

from sglang_dspark.cpu_features import cpu_model_and_flags


def describe_machine(cpuinfo: str | None = None) -> str:
    """E.g. 'AMD EPYC (avx2), x86_64, 2 cores'."""
    model, flags = cpu_model_and_flags(cpuinfo)
    simd = f" ({', '.join(flags)})" if flags else ""
    return f"{model}{simd}, {platform.machine()}, {os.cpu_count()} cores"
