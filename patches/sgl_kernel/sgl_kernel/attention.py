"""Paged attention for sglang's intel_amx backend, in plain torch (fp32 math).

sglang reaches these as torch.ops.sgl_kernel.{decode,extend}_attention_cpu, so
they are registered as torch custom ops. Argument order is the one
sglang/srt/layers/attention/intel_amx_backend.py (0.5.23) passes positionally.

KV layout: k_buffer / v_buffer are [num_slots, num_kv_heads, head_dim]; request
i's tokens live at slots req_to_token[req_pool_indices[i], :seq_lens[i]].
"""

from __future__ import annotations

from typing import Optional

import torch

from sgl_kernel._trace import traced


def _gather_kv(buffer: torch.Tensor, slots: torch.Tensor, scale: float) -> torch.Tensor:
    kv = buffer[slots.to(torch.long)].float()
    return kv * scale if scale != 1.0 else kv


def _attend(
    q: torch.Tensor,  # [Lq, H, Dk]
    k: torch.Tensor,  # [Lk, Hkv, Dk]
    v: torch.Tensor,  # [Lk, Hkv, Dv]
    visible: Optional[torch.Tensor],  # bool [Lq, Lk] or None (all visible)
    sm_scale: float,
    logit_cap: float,
    sinks: Optional[torch.Tensor],  # [H] extra per-head logit in the softmax denominator
) -> torch.Tensor:
    """Softmax attention with grouped KV heads; returns fp32 [Lq, H, Dv]."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible[None], float("-inf"))
    if sinks is not None:
        sink_col = sinks.float().view(num_heads, 1, 1).expand(num_heads, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs)  # a fully masked row (no visible key) yields zeros
    return torch.einsum("hqk,khd->qhd", probs, v.float())


def _window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """A query sees a key at most window-1 positions back (window counts the query itself)."""
    return (q_pos[:, None] - k_pos[None, :]) < window


def decode_attention(
    query: torch.Tensor,  # [bs, H, Dk]
    k_cache: torch.Tensor,  # mutated when key is given
    v_cache: torch.Tensor,  # mutated when value is given
    key_scale: float,
    value_scale: float,
    output: torch.Tensor,  # mutated [bs, H, Dv]
    key: Optional[torch.Tensor],  # new token's K, written at loc before attending
    value: Optional[torch.Tensor],
    loc: Optional[torch.Tensor],
    attn_logits: torch.Tensor,  # scratch of the C++ split-K kernel; unused here
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,  # includes the new token
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window: int,  # layer.sliding_window_size + 1; <= 0 means no window
    encoder_lens: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
) -> None:
    if is_cross_attention:
        raise NotImplementedError("sgl_kernel stand-in: decode_attention_cpu with cross attention")
    if key is not None and value is not None and loc is not None:
        slots = loc.to(torch.long)
        k_cache[slots] = key.reshape(slots.numel(), *k_cache.shape[1:]).to(k_cache.dtype)
        v_cache[slots] = value.reshape(slots.numel(), *v_cache.shape[1:]).to(v_cache.dtype)
    for i, (row, length) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        first = max(0, length - sliding_window) if sliding_window > 0 else 0
        slots = req_to_token[row, first:length]
        k = _gather_kv(k_cache, slots, key_scale)
        v = _gather_kv(v_cache, slots, value_scale)
        out = _attend(query[i : i + 1], k, v, None, sm_scale, logit_cap, sinks)
        output[i] = out[0].to(output.dtype)


def extend_attention(
    q_extend: torch.Tensor,  # [N, H, Dk], requests packed back to back
    k_extend: Optional[torch.Tensor],  # [N, Hkv, Dk] or None (then read from the cache)
    v_extend: Optional[torch.Tensor],
    o_extend: torch.Tensor,  # mutated [N, H, Dv]
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,  # prefix + extend
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: Optional[int],  # sizing hint of the C++ kernel; unused
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window: int,
    encoder_lens: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    tree_mask: Optional[torch.Tensor],  # spec verify: bool [sum(ext^2)], [i, j] = draft j visible to draft i
    is_causal: bool,
) -> None:
    """Each request attends its new tokens to prefix (all visible) + new tokens
    (causal, or the tree mask when given, or all when not causal)."""
    if is_cross_attention:
        raise NotImplementedError("sgl_kernel stand-in: extend_attention_cpu with cross attention")
    flat_tree = tree_mask.reshape(-1).bool() if tree_mask is not None else None
    tree_off = 0
    rows = req_pool_indices.tolist()
    for i, (length, ext, start) in enumerate(
        zip(seq_lens.tolist(), extend_seq_lens.tolist(), extend_start_loc.tolist())
    ):
        prefix = length - ext
        slots = req_to_token[rows[i], :length]
        k = _gather_kv(k_buffer, slots, key_scale)
        v = _gather_kv(v_buffer, slots, value_scale)
        if k_extend is not None and v_extend is not None:
            k[prefix:] = k_extend[start : start + ext].reshape(ext, *k.shape[1:]).float()
            v[prefix:] = v_extend[start : start + ext].reshape(ext, *v.shape[1:]).float()

        visible = torch.ones((ext, length), dtype=torch.bool)
        if flat_tree is not None:
            visible[:, prefix:] = flat_tree[tree_off : tree_off + ext * ext].view(ext, ext)
            tree_off += ext * ext
        elif is_causal:
            visible[:, prefix:] = torch.ones((ext, ext), dtype=torch.bool).tril()
        if sliding_window > 0:
            q_pos = torch.arange(prefix, length)
            visible &= _window_mask(q_pos, torch.arange(length), sliding_window)

        q = q_extend[start : start + ext]
        out = _attend(q, k, v, visible, sm_scale, logit_cap, sinks)
        o_extend[start : start + ext] = out.to(o_extend.dtype)


# ------------------------------------------------------------------ registration
_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")
_LIB.define(
    "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float key_scale, "
    "float value_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor? loc, Tensor attn_logits, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
    "bool is_cross_attention, int sliding_window, Tensor? encoder_lens, Tensor? sinks) -> ()"
)
_LIB.define(
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float key_scale, float value_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
    "int? max_len_extend, float sm_scale, float logit_cap, bool is_cross_attention, int sliding_window, "
    "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()"
)
_LIB.impl("decode_attention_cpu", traced(decode_attention), "CPU")
_LIB.impl("extend_attention_cpu", traced(extend_attention), "CPU")
