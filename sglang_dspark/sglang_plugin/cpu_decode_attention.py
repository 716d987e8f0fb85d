"""SGLang's torch_native decode attention for bf16 / fp16 KV through dspark_kernels/cpu_verify_attention.py.

A plain decode step is a one-token chain per request, so it takes the same code as a one-token verify chain: two
fp32 matrix products instead of torch's CPU SDPA, which on one bf16 query row costs 3-7x as much from ~300 KV
tokens on (that module says where the time goes). It is installed for every server of this package, with and
without speculation, so that a speculation A/B compares speculation and nothing else. The AROUND hook declines
(SGLang's own code runs) for fp32 KV, encoder / cross attention, sliding windows, mixed query / KV dtypes, and when
SGLANG_DSPARK_NO_CPU_ATTENTION is set.
"""

from __future__ import annotations

import os

import torch

DISABLE_ENV = "SGLANG_DSPARK_NO_CPU_ATTENTION"  # any non-empty value: SGLang's decode attention


def handles(query: torch.Tensor, k_cache: torch.Tensor, encoder_lens, is_cross_attn: bool, causal: bool,
            sliding_window_size) -> bool:
    from dspark_kernels.cpu_verify_attention import REDUCED_DTYPES

    windowed = sliding_window_size is not None and sliding_window_size > -1
    return (query.device.type == "cpu" and query.dtype in REDUCED_DTYPES and k_cache.dtype == query.dtype
            and encoder_lens is None and not is_cross_attn and not causal and not windowed
            and not os.environ.get(DISABLE_ENV))


def around_run_sdpa_forward_decode(original, backend, query, output, k_cache, v_cache, req_to_token,
                                   req_pool_indices, seq_lens, encoder_lens=None, scaling=None, enable_gqa=False,
                                   causal=False, is_cross_attn=False, sliding_window_size=None):
    if not handles(query, k_cache, encoder_lens, is_cross_attn, causal, sliding_window_size):
        return original(backend, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        encoder_lens, scaling=scaling, enable_gqa=enable_gqa, causal=causal,
                        is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
    from dspark_kernels.cpu_verify_attention import chain_attention_sdpa

    ones = torch.ones_like(seq_lens)
    return chain_attention_sdpa(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, ones,
                                scale=scaling)


def register(HookRegistry, HookType) -> None:
    HookRegistry.register(
        "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_decode",
        around_run_sdpa_forward_decode, HookType.AROUND)
