"""What the CPU can do, read from /proc/cpuinfo: its model and the SIMD flags that decide the bf16 paths (the CPU
engine's GEMM dispatch, training's autocast). A leaf module: the plugin, training and the benchmarks all read it."""

from __future__ import annotations

import platform

SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # the ones worth recording next to a number
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # a native bf16 dot product: bf16 GEMMs pay, no upcast


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
    return model, [f for f in SIMD_FLAGS if f in flags]


def has_native_bf16(cpu_flags) -> bool:
    return any(f in cpu_flags for f in NATIVE_BF16_FLAGS)
