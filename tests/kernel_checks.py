"""Shared by the kernel test files: which device a case may run on, and the chi-square bound they test against."""

from __future__ import annotations

import math
import os

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def device_or_skip(device: str, kernel) -> None:
    """Skip a case (with the reason) unless `kernel` (None: Triton missing) can run on `device`: CPU needs the
    Triton interpreter, chosen before dspark_kernels/ was imported; CUDA needs a device and the interpreter off."""
    if kernel is None:
        pytest.skip("triton is not importable")
    if device == "cpu" and not INTERPRET:
        pytest.skip("CPU case needs TRITON_INTERPRET=1 (disabled because CUDA is present)")
    if device == "cpu" and type(kernel).__name__ != "InterpretedFunction":
        pytest.skip("dspark_kernels/ was imported before TRITON_INTERPRET=1 was set; run this file on its own")
    if device == "cuda" and (not torch.cuda.is_available() or INTERPRET):
        pytest.skip("no CUDA device (or the interpreter is forced on)")


def cuda_flashinfer_or_skip() -> None:
    """Skip (printing the reason) unless a CUDA device and an importable FlashInfer are both present."""
    from dspark_kernels.flashinfer_verify import FLASHINFER_IMPORT_ERROR, HAS_FLASHINFER

    if not torch.cuda.is_available():
        print("SKIP reason: no CUDA device")
        pytest.skip("no CUDA device: FlashInfer ragged verify needs a GPU")
    if not HAS_FLASHINFER:
        print(f"SKIP reason: flashinfer not importable ({FLASHINFER_IMPORT_ERROR})")
        pytest.skip(f"flashinfer not importable ({FLASHINFER_IMPORT_ERROR})")


def ragged_layout(chain_lens, prefix_lens, H, Hkv, hd, page_size, dtype, device="cpu", seed=0, spare_pages=3,
                  num_pages=None):
    """Packed queries plus a shuffled paged (or flat, page_size 1) cache holding prefix + chain K/V:
    [q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_lens] on `device`."""
    from dspark_kernels import kv_indptr_from_lens

    gen = torch.Generator().manual_seed(seed)
    n = torch.tensor(chain_lens, dtype=torch.int32)
    kv_lens = torch.tensor(prefix_lens, dtype=torch.int32) + n
    qo = torch.zeros(len(n) + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(n, 0)
    kvp = kv_indptr_from_lens(kv_lens, page_size)
    num_pages = num_pages or int(kvp[-1]) + spare_pages
    indices = torch.randperm(num_pages, generator=gen)[: int(kvp[-1])].to(torch.int32)
    shape = (num_pages, Hkv, hd) if page_size == 1 else (num_pages, page_size, Hkv, hd)
    k = torch.randn(*shape, generator=gen).to(dtype)
    v = torch.randn(*shape, generator=gen).to(dtype)
    q = torch.randn(int(qo[-1]), H, hd, generator=gen).to(dtype)
    return [x.to(device) for x in (q, k, v, qo, kvp, indices, kv_lens)]


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 3.09: alpha = 1e-3)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
