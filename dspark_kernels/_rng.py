"""Counter-based random numbers shared by the Triton kernels and their torch references.

Why not `tl.rand` (Philox): its stream cannot be reproduced cheaply in torch, so a reference could only be
compared by distribution. This hash (two rounds of a 32-bit avalanche mix over (key, counter)) is written
twice, once in Triton and once in torch with exact 32-bit arithmetic, so kernel and reference draw the SAME
uniforms: temperature sampling is testable by equality, not only by chi-square. It is a statistical RNG
(good avalanche, no cryptographic claim), which is all Gumbel-max sampling and rejection tests need.

Stream layout (one 64-bit seed per request, several independent streams per seed):
    key1, key2 = stream_keys(seed, salt)          # per request and stream
    bits       = mix(mix(counter ^ key1) + key2)  # per element, counter < 2**32
    uniform    = ((bits >> 9) + 0.5) * 2**-23     # in (0, 1), exactly representable in fp32
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # CPU-only installs without triton still get the torch references
    HAS_TRITON = False

MASK32 = 0xFFFFFFFF
MIX_C1 = 0x7FEB352D
MIX_C2 = 0x846CA68B
SEED_SALT_HI = 0x632BE5AB
KEY2_SALT = 0x27D4EB2F

# One salt per stream so that the same request seed never reuses uniforms across kernels.
SALT_DRAFT_GUMBEL = 0x9E3779B9  # markov sampler: Gumbel noise over the vocabulary, counter = k * V + v
SALT_ACCEPT_U = 0x85EBCA6B  # ragged accept: acceptance uniforms, counter = draft position i
SALT_BONUS_GUMBEL = 0xC2B2AE35  # ragged accept: residual / bonus Gumbel noise, counter = v


# ----------------------------------------------------------------------------------------------- torch


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 tensors holding uint32 values, without int64 overflow."""
    lo = (x & 0xFFFF) * c
    hi = (((x >> 16) * c) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def mix32_torch(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_C1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_C2)
    return x ^ (x >> 16)


def stream_keys_torch(seeds: torch.Tensor, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-request stream keys (int64 tensors holding uint32) from int64 seeds."""
    seeds = seeds.to(torch.int64)
    lo = seeds & MASK32
    hi = (seeds >> 32) & MASK32
    key1 = mix32_torch(lo ^ mix32_torch(hi ^ ((salt + SEED_SALT_HI) & MASK32)))
    key2 = mix32_torch(key1 ^ KEY2_SALT)
    return key1, key2


def uniform_torch(key1: torch.Tensor, key2: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """fp32 uniforms in (0, 1); key/counter broadcast together (int64 holding uint32)."""
    h = mix32_torch(counter ^ key1)
    h = mix32_torch((h + key2) & MASK32)
    return ((h >> 9).to(torch.float32) + 0.5) * (2.0**-23)


def gumbel_torch(key1: torch.Tensor, key2: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    u = uniform_torch(key1, key2, counter)
    return -torch.log(-torch.log(u))


# ---------------------------------------------------------------------------------------------- triton

if HAS_TRITON:

    @triton.jit
    def mix32(x):
        x = x ^ (x >> 16)
        x = x * 0x7FEB352D
        x = x ^ (x >> 15)
        x = x * 0x846CA68B
        return x ^ (x >> 16)

    @triton.jit
    def stream_keys(seed, SALT: tl.constexpr):
        """seed: int64 tensor (any shape) -> (key1, key2) uint32 tensors."""
        lo = (seed & 0xFFFFFFFF).to(tl.uint32)
        hi = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
        salt_hi = (SALT + 0x632BE5AB) & 0xFFFFFFFF
        key1 = mix32(lo ^ mix32(hi ^ salt_hi))
        key2 = mix32(key1 ^ 0x27D4EB2F)
        return key1, key2

    @triton.jit
    def uniform(key1, key2, counter):
        """key1/key2 uint32, counter any int (cast to uint32) -> fp32 in (0, 1)."""
        h = mix32(counter.to(tl.uint32) ^ key1)
        h = mix32(h + key2)
        return ((h >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2**-23

    @triton.jit
    def gumbel(key1, key2, counter):
        u = uniform(key1, key2, counter)
        return -tl.log(-tl.log(u))
