"""KV-pool bookkeeping ops: req_to_token writes and raw KV row moves.

All index tensors are small (one entry per request or per slot), so plain
Python loops over the batch are fine; the bulk copies are torch slicing.
"""

from __future__ import annotations

import ctypes

import torch


def _segments(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list[tuple[int, int, int]]:
    """(start, end, packed_offset) per request: request i's slots sit at
    packed_offset = sum of the earlier requests' (end - start)."""
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    out, packed = [], 0
    for s, e in zip(starts, ends):
        out.append((s, e, packed))
        packed += e - s
    return out


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,  # mutated
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the i-th packed run of out_cache_loc."""
    assert req_to_token.shape[1] == pool_len, (req_to_token.shape, pool_len)
    for row, (s, e, off) in zip(req_pool_indices.tolist(), _segments(start_offset, end_offset)):
        if e > s:
            req_to_token[row, s:e] = out_cache_loc[off : off + (e - s)].to(req_to_token.dtype)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every buffer b (one per layer and K/V), copy row src_loc[j] onto row
    tgt_loc[j]; a row is strides[b] bytes starting at data_ptrs[b] + loc * strides[b].

    sglang hands raw addresses (its Triton kernel does pointer arithmetic), so we
    view each buffer's first (max_loc + 1) rows as bytes through ctypes. All
    sources are gathered before any target is written, so overlapping moves are safe.
    """
    if tgt_loc.numel() == 0:
        return
    assert tgt_loc.numel() == src_loc.numel(), (tgt_loc.shape, src_loc.shape)
    tgt = tgt_loc.to(torch.long)
    src = src_loc.to(torch.long)
    num_rows = int(torch.maximum(tgt.max(), src.max()).item()) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (num_rows * stride)).from_address(int(ptr))
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, stride)
        rows[tgt] = rows[src].clone()
