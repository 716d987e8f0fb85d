"""Ragged chain-verify attention on the CPU: one torch SDPA call per request over only the chain's query rows.

Why: SGLang's torch_native backend runs an EXTEND with a prefix by padding every request's query to its full KV
length and computing the whole causal L x L attention ("redundant" rows), then keeping the last rows. For a verify
chain of n << L tokens that is ~L/n times the needed work: on the embedded 0.5B model (24 layers, KV ~150) it made
a 2-token verify forward cost 55 ms more than a decode at batch 1 and ~900 ms more at batch 16 (single thread).
Here query row i of a chain whose last n of L KV tokens are the chain sees KV positions j <= L - n + i (the same
bottom-right-aligned causal mask as `ragged_verify_attention_reference`). A 1-token chain has no mask at all, so it
runs the exact call SGLang's decode path makes for that request.

Layout is SGLang's: k_cache / v_cache [num_slots, Hkv, hd]; request r's KV slots are
req_to_token[req_pool_indices[r], :seq_lens[r]]; queries are packed back to back [T, H, hd].
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention


def chain_attention_sdpa(
    q_packed: torch.Tensor,
    out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Writes and returns out [T, H, hd]; extend_lens[r] = chain length (0 allowed), seq_lens[r] = KV length
    including the chain."""
    heads, kv_heads = q_packed.shape[1], k_cache.shape[1]
    gqa = heads != kv_heads
    start = 0
    for row, kv_len, n in zip(req_pool_indices.tolist(), seq_lens.tolist(), extend_lens.tolist()):
        if n == 0:
            continue
        slots = req_to_token[row, :kv_len]
        k = k_cache[slots].transpose(0, 1)  # [Hkv, L, hd]
        v = v_cache[slots].transpose(0, 1)
        q = q_packed[start:start + n].transpose(0, 1)  # [H, n, hd]
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        if n == 1:
            o = scaled_dot_product_attention(q[None], k[None], v[None], scale=scale, enable_gqa=gqa)
        elif n == kv_len:
            o = scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            pos = torch.arange(kv_len, device=q.device)
            visible = pos[None, :] <= (kv_len - n + torch.arange(n, device=q.device))[:, None]
            o = scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=visible, scale=scale,
                                             enable_gqa=gqa)
        out[start:start + n] = o[0].transpose(0, 1).to(out.dtype)
        start += n
    return out
