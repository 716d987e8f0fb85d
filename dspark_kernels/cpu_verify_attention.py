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

bf16 / fp16 one-row chains (and plain decoding, sglang_plugin/cpu_decode_attention.py) run as two fp32 matrix
products instead of SDPA: torch's CPU SDPA on one bf16 query row costs ~0.8 us per KV token for the embedded
model's 14 heads (620 us per layer at 800 KV tokens on a 2-core EPYC Zen 4; two rows take about half that), and
the fp32 products ~180 us. Those read the same, exactly upcast values and differ from SDPA in rounding
only (fp32 accumulation, one rounding to the output dtype), the class of difference bf16 batch variance already
has. Longer chains keep SDPA, faster than the fp32 products there (masking and 8x the rows); fp32 inputs keep
SDPA, so fp32 results stay SGLang's own. Slots are gathered with index_select: ~6 us for 800 slots, where advanced
indexing takes ~40 us.
"""

from __future__ import annotations

import torch
from torch.nn.functional import scaled_dot_product_attention

REDUCED_DTYPES = (torch.bfloat16, torch.float16)


def _one_row_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> torch.Tensor:
    """q [H, 1, hd], k / v [Hkv, L, hd] -> fp32 [H, 1, hd]: one query row over all L positions; the H / Hkv query
    heads of a group share their KV head."""
    heads, _, hd = q.shape
    kv_heads = k.shape[0]
    qf = q.reshape(kv_heads, heads // kv_heads, hd).float()
    scores = torch.bmm(qf, k.float().transpose(1, 2)).mul_(hd ** -0.5 if scale is None else scale)
    return torch.bmm(torch.softmax(scores, dim=-1), v.float()).view(heads, 1, hd)


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
        k = k_cache.index_select(0, slots).transpose(0, 1)  # [Hkv, L, hd]
        v = v_cache.index_select(0, slots).transpose(0, 1)
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
