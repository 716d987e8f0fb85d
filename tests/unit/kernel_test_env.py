"""Shared set-up of the kernel tests (tests/unit/test_kernels_*.py): interpreter choice, skip rules, chi-square bound.

Import this module BEFORE anything from kernels/. Triton reads TRITON_INTERPRET when it decorates the kernels, and
that happens when kernels/ is first imported. On a CPU-only machine we choose the interpreter; on a CUDA machine the
kernels run compiled instead, and the CPU cases are skipped. The repo root (kernels/, tests/) is on sys.path through
pyproject.toml's pytest `pythonpath`.
"""

import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernels._rng import HAS_TRITON  # noqa: E402  (after TRITON_INTERPRET: this import decorates every kernel)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def device_or_skip(device: str, kernel: object) -> None:
    """Skip the calling test unless the Triton `kernel` (a @triton.jit function of kernels/) can run on `device`.

    `kernel` may be None where triton is not importable; that case is skipped first.
    """
    if not HAS_TRITON:
        pytest.skip("triton is not importable")
    if device == "cpu" and not INTERPRET:
        pytest.skip("CPU case needs TRITON_INTERPRET=1 (disabled because CUDA is present)")
    if device == "cpu" and type(kernel).__name__ != "InterpretedFunction":
        pytest.skip("kernels/ was imported before TRITON_INTERPRET=1 was set; run this file on its own")
    if device == "cuda" and (not torch.cuda.is_available() or INTERPRET):
        pytest.skip("no CUDA device (or the interpreter is forced on)")


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 3.09: alpha = 1e-3)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
