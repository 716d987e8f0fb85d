"""Ragged chain-verify attention on the CPU: one torch SDPA call per request over only the chain's query rows.

Why: SGLang's torch_native backend runs an EXTEND with a prefix by padding every request's query to its full KV
length and computing the whole causal L x L attention ("redundant" rows), then keeping the last rows. For a verify
chain of n << L tokens that is ~L/n times the needed work: on the embedded 0.5B model (24 layers, KV ~150) it made
a 2-token verify forward cost 55 ms more than a decode at batch 1 and ~900 ms more at batch 16 (single thread).
Here query row i of a chain whose last n of L KV tokens are the chain sees KV positions j <= L - n + i (the same
bottom-right-aligned causal mask as `ragged_verify_attention_reference`). A 1-token fp32 chain has no mask at all,
so it runs the exact call SGLang's decode path makes for that request.

Layout is SGLang's: k_cache / v_cache [num_slots, Hkv, hd]; request r's KV slots are
req_to_token[req_pool_indices[r], :seq_lens[r]]; queries are packed back to back [T, H, hd].

bf16 / fp16 chains (and plain decoding, sglang_plugin/cpu_decode_attention.py) run as two fp32 matrix products
instead of SDPA: torch's CPU SDPA on one bf16 query row costs ~0.8 us per KV token for the embedded model's 14 heads
(620 us per layer at 800 KV tokens on a 2-core EPYC Zen 4; two rows take about half that), and the fp32 products
~180 us. Chains of up to MAX_FP32_ROWS rows do the same with all their rows in one product per KV head and the
causal mask applied to the chain's own n x n corner only (the other L - n columns are visible to every row): at
batch 1, 150-660 KV tokens and 2-8 rows that is 1.10-1.62x faster than SDPA with its full L-wide mask, at batch 4-16
1.07-1.71x except 8-row chains over 600+ KV tokens (0.88-1.27x between runs) (2026-12-07, EPYC Zen 4,
`benchmarks/cpu_verify_attention.py`). Those read the same, exactly upcast values and differ from SDPA in rounding
only (fp32 accumulation, one rounding to the output dtype), the class of difference bf16 batch variance already
has. fp32 inputs keep SDPA, so fp32 results stay SGLang's own. Slots are gathered with index_select: ~6 us for 800
slots, where advanced indexing takes ~40 us.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch.nn.functional import scaled_dot_product_attention

REDUCED_DTYPES = (torch.bfloat16, torch.float16)
MAX_FP32_ROWS = 16  # reduced-precision chains up to this long take _chain_fp32 (a verify is at most gamma + 1 rows)


def _one_row_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q [H, 1, hd], k / v [Hkv, L, hd] -> fp32 [H, 1, hd]: one query row over all L positions; the H / Hkv query
    heads of a group share their KV head."""
    heads, _, hd = q.shape
    kv_heads = k.shape[0]
    qf = q.reshape(kv_heads, heads // kv_heads, hd).float()
    scores = torch.bmm(qf, k.float().transpose(1, 2)).mul_(hd ** -0.5 if scale is None else scale)
    return torch.bmm(torch.softmax(scores, dim=-1), v.float()).view(heads, 1, hd)


@lru_cache(maxsize=64)
def _future(n: int) -> torch.Tensor:
    """Bool[n, n]: True where chain row i would see chain position j > i."""
    return torch.ones(n, n, dtype=torch.bool).triu_(1)


def _chain_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q [n, H, hd] (a chain's rows, the last n of its L KV positions), k / v [L, Hkv, hd] -> fp32 [n, H, hd]: row i
    sees KV positions j <= L - n + i. Query head h reads KV head h // (H / Hkv), as SDPA's enable_gqa does."""
    n, heads, hd = q.shape
    L, kv_heads = k.shape[0], k.shape[1]
    g = heads // kv_heads
    qf = q.float().view(n, kv_heads, g, hd).permute(1, 2, 0, 3).reshape(kv_heads, g * n, hd)
    scores = torch.bmm(qf, k.float().permute(1, 2, 0)).mul_(hd ** -0.5 if scale is None else scale)
    scores.view(kv_heads, g, n, L)[..., L - n:].masked_fill_(_future(n), float("-inf"))
    out = torch.bmm(torch.softmax(scores, dim=-1), v.float().transpose(0, 1))  # [Hkv, g * n, hd]
    return out.view(kv_heads, g, n, hd).permute(2, 0, 1, 3).reshape(n, heads, hd)


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
        k_rows, v_rows = k_cache.index_select(0, slots), v_cache.index_select(0, slots)  # [L, Hkv, hd]
        if 1 < n <= MAX_FP32_ROWS and q_packed.dtype in REDUCED_DTYPES:
            out[start:start + n] = _chain_fp32(q_packed[start:start + n], k_rows, v_rows, scale).to(out.dtype)
            start += n
            continue
        k, v = k_rows.transpose(0, 1), v_rows.transpose(0, 1)  # [Hkv, L, hd]
        q = q_packed[start:start + n].transpose(0, 1)  # [H, n, hd]
        if n == 1 and q.dtype in REDUCED_DTYPES:
            out[start] = _one_row_fp32(q, k, v, scale)[:, 0].to(out.dtype)
            start += 1
            continue
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
