"""Neox-style rotary embedding on CPU in one C call (csrc/rotary_neox.c), bit-identical to SGLang's torch path.

`rotary_neox(positions, query, key, cos_sin_cache, head_size, rotary_dim)` returns (query, key) rotated, new
tensors of the inputs' shapes, or None where the kernel does not apply (not built here, CUDA tensors, a dtype
other than bf16 / fp32, a cache of another dtype, rows that are not unit-stride); the caller then runs torch's.
Built like the GEMM kernels (dspark_kernels/cpu_bf16_gemm.py): with the system C compiler, into the user cache, on
first use.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from dspark_kernels.cpu_bf16_gemm import build_kernel

logger = logging.getLogger(__name__)

SOURCE = "rotary_neox.c"
CFLAGS = ("-O3", "-ffp-contract=off", "-shared", "-fPIC")
ARGTYPES = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p,
             ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_long] * 5 + [ctypes.c_int])
_loaded: tuple[object | None, str] | None = None


def load() -> tuple[object | None, str]:
    """(the kernel's ctypes function, "") or (None, why not); built and loaded once per process."""
    global _loaded
    if _loaded is None:
        fn, _, reason = build_kernel(SOURCE, CFLAGS, (), "rotary_neox", ARGTYPES)
        _loaded = (fn, reason)
        if fn is None:
            logger.info("CPU rotary kernel unavailable: %s", reason)
    return _loaded


def _rows(x: torch.Tensor, num_tokens: int, head_size: int) -> torch.Tensor | None:
    """x as [T, width] with unit-stride rows (a view where it can be), or None."""
    x2 = x.reshape(num_tokens, -1) if x.dim() != 2 else x
    if x2.shape[1] % head_size or x2.stride(1) != 1:
        return None
    return x2


def rotary_neox(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_sin_cache: torch.Tensor,
                head_size: int, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    fn = load()[0]
    dtype = query.dtype
    if (fn is None or dtype not in (torch.bfloat16, torch.float32) or key.dtype != dtype
            or cos_sin_cache.dtype != dtype or query.device.type != "cpu" or key.device.type != "cpu"
            or cos_sin_cache.device.type != "cpu" or rotary_dim % 2 or rotary_dim > head_size
            or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rotary_dim):
        return None
    pos = positions.reshape(-1)
    t = pos.shape[0]
    q2, k2 = _rows(query, t, head_size), _rows(key, t, head_size)
    if q2 is None or k2 is None:
        return None
    if t and (int(pos.min()) < 0 or int(pos.max()) >= cos_sin_cache.shape[0]):
        return None  # torch's index_select raises the error for these
    pos = pos.to(torch.int64).contiguous()
    cache = cos_sin_cache.contiguous()
    q_out = torch.empty(q2.shape, dtype=dtype)
    k_out = torch.empty(k2.shape, dtype=dtype)
    if t:
        fn(pos.data_ptr(), q2.data_ptr(), q2.stride(0), k2.data_ptr(), k2.stride(0), q_out.data_ptr(),
           k_out.data_ptr(), cache.data_ptr(), t, q2.shape[1] // head_size, k2.shape[1] // head_size, head_size,
           rotary_dim, int(dtype == torch.bfloat16))
    return q_out.reshape(query.shape), k_out.reshape(key.shape)
