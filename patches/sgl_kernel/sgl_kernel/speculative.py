"""`sgl_kernel.speculative`: a real submodule, because sglang imports
`from sgl_kernel.speculative import reconstruct_indices_from_tree_mask` (NGRAM).
The other names mirror the real package's layout."""

from __future__ import annotations

import torch

from sgl_kernel._trace import traced
from sgl_kernel.kvcache import assign_req_to_token_pool_cpu
from sgl_kernel.spec_ops import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,  # bool [bs * n * n]; [b, i, j] = node j is visible to node i
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,  # mutated [bs * n]
    retrieve_index: torch.Tensor,  # mutated [bs, n]
    retrieve_next_token: torch.Tensor,  # mutated [bs, n]
    retrieve_next_sibling: torch.Tensor,  # mutated [bs, n]
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM verify metadata from a tree given only as a visibility mask.

    Strict ancestors of i are the visible j < i. Then: position = depth + seq_len,
    parent = nearest (largest) ancestor, first child of t = smallest k whose
    ancestors include t, next sibling = smallest later node with the same parent
    (-1 for the root or when there is none).
    """
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    node = torch.arange(n, device=tree_mask.device)
    mask = tree_mask.reshape(-1)[: bs * n * n].view(bs, n, n).bool()
    anc = mask & (node[None, :] < node[:, None])[None]  # anc[b, i, j]: j is a strict ancestor of i

    depth = anc.sum(dim=2)
    positions.view(-1)[: bs * n] = (depth + verified_seq_len.view(bs, 1).to(depth.dtype)).reshape(-1).to(positions.dtype)
    retrieve_index.view(bs, n)[:] = (torch.arange(bs, device=node.device)[:, None] * n + node[None]).to(retrieve_index.dtype)

    parent = torch.where(anc, node[None, None, :], -1).amax(dim=2)  # [bs, n]
    first_child = torch.where(anc, node[None, :, None], n).amin(dim=1)  # min over i for column t
    retrieve_next_token.view(bs, n)[:] = torch.where(first_child < n, first_child, -1).to(retrieve_next_token.dtype)

    later = node[None, :, None] > node[None, None, :]  # [1, k, t]: k comes after t
    same_parent = (parent[:, :, None] == parent[:, None, :]) & later
    next_sib = torch.where(same_parent, node[None, :, None], n).amin(dim=1)
    next_sib = torch.where((parent >= 0) & (next_sib < n), next_sib, -1)
    retrieve_next_sibling.view(bs, n)[:] = next_sib.to(retrieve_next_sibling.dtype)


reconstruct_indices_from_tree_mask = traced(reconstruct_indices_from_tree_mask)


__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]
