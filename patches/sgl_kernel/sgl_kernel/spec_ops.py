"""Speculative-decoding bookkeeping ops (cache locations, tree build/verify).

Semantics follow the call sites and the Triton/CUDA kernels in
sglang/kernels/ops/speculative/*.py (0.5.23); see README.md for the list.
Batches are tiny on CPU, so per-request Python loops are acceptable.
"""

from __future__ import annotations

import torch

# sglang.kernels.ops.speculative.spec_tree.TreeMaskMode values
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


# ---------------------------------------------------------------- cache locations
def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,  # mutated
    pool_len: int,
) -> None:
    """Pack req_to_token[req_pool_indices[i], start[i]:end[i]] for all i into out_cache_loc."""
    assert req_to_token.shape[1] == pool_len, (req_to_token.shape, pool_len)
    packed = 0
    for row, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        if e > s:
            out_cache_loc[packed : packed + (e - s)] = req_to_token[row, s:e].to(out_cache_loc.dtype)
            packed += e - s


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,  # mutated
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Request i's topk * num_steps draft slots, req_to_token[row, seq_len : seq_len + topk*num_steps],
    go to out_cache_loc[i * topk*num_steps : (i+1) * topk*num_steps]."""
    assert req_to_token.shape[1] == pool_len, (req_to_token.shape, pool_len)
    width = topk * num_steps
    for i, (row, sl) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[row, sl : sl + width].to(out_cache_loc.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """Expanded req_to_token for multi-step draft decode: row b*topk + k holds request b's
    committed prefix (seq_lens[b] slots) followed by candidate k's num_steps draft slots,
    which assign_draft_cache_locs_contiguous laid out at seq_lens[b] + k*num_steps.
    Entries past seq_lens[b] + num_steps are undefined (zero here)."""
    num_seqs = req_pool_indices.numel()
    out = torch.zeros((num_seqs * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for b, (row, sl) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        src = req_to_token[row]
        for k in range(topk):
            dst = out[b * topk + k]
            dst[:sl] = src[:sl]
            dst[sl : sl + num_steps] = src[sl + k * num_steps : sl + (k + 1) * num_steps]
    return out


# ---------------------------------------------------------------- accept bookkeeping
def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,  # mutated
    accept_stride: int,
) -> None:
    """bonus_tokens[i] = the last accepted token of request i (accept_lens counts the bonus)."""
    bs = accept_lens.numel()
    if bs == 0:
        return
    flat_idx = torch.arange(bs, device=accept_lens.device) * accept_stride + accept_lens.to(torch.long) - 1
    bonus_tokens[:bs] = accept_tokens.reshape(-1)[flat_idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,  # mutated
) -> None:
    """Compact: the KV slots of accepted tokens (accept_index != -1), in order."""
    idx = accept_index.reshape(-1).to(torch.long)
    kept = idx[idx >= 0]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,  # mutated
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None,
) -> None:
    """Per request: shift its extend ids left by one and put topk_index[i] in the freed
    last slot (or at select_index[i] when given). Used by multi-layer EAGLE (MTP)."""
    new_tokens = topk_index.reshape(-1)
    for i, (start, n) in enumerate(zip(extend_start_loc.tolist(), extend_seq_lens.tolist())):
        if n <= 0:
            continue
        input_ids[start : start + n - 1] = input_ids[start + 1 : start + n].clone()
        last = int(select_index[i]) if select_index is not None else start + n - 1
        input_ids[last] = new_tokens[i]


# ---------------------------------------------------------------- EAGLE token tree
def _tree_parents(selected: list[int], parents: list[int], topk: int) -> list[int]:
    """Parent node of every tree node. Node 0 is the verified root; node i >= 1 is the
    draft candidate selected[i-1] (an index into the flattened per-step topk list).
    The candidate came from beam selected//topk; beam 0 is the root, any other beam
    is the candidate parents[beam]. -1 means the parent is not in the tree."""
    n = len(selected) + 1
    node_of = {}
    for pos in range(len(selected) - 1, -1, -1):  # first occurrence wins
        node_of[selected[pos]] = pos + 1
    out = [-1] * n
    for i in range(1, n):
        beam = selected[i - 1] // topk
        out[i] = 0 if beam == 0 else node_of.get(parents[beam], -1)
    return out


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,  # mutated
    positions: torch.Tensor,  # mutated
    retrieve_index: torch.Tensor,  # mutated
    retrieve_next_token: torch.Tensor,  # mutated
    retrieve_next_sibling: torch.Tensor,  # mutated
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Turn EAGLE's top-k draft selection into a tree: attention mask, positions, and
    first-child / next-sibling links (children in increasing node order).

    tree_mask: FULL_MASK rows are [seq_len prefix | n tree] per request, packed
    (the prefix part is the caller's, left untouched); QLEN_ONLY rows are n wide.
    A node sees the root, itself and its ancestors, at most `depth` levels up.
    """
    mode = int(tree_mask_mode)
    if mode == QLEN_ONLY_BITPACKING:
        raise NotImplementedError("sgl_kernel stand-in: build_tree_kernel_efficient_cpu QLEN_ONLY_BITPACKING")
    n = draft_token_num
    seq_lens = verified_seq_len.tolist()
    sel_rows = selected_index.reshape(len(seq_lens), -1).tolist()
    par_rows = parent_list.reshape(len(seq_lens), -1).tolist()
    flat_mask = tree_mask.view(-1)
    pos = positions.view(-1)
    prefix_sum = 0
    for b, sl in enumerate(seq_lens):
        parent = _tree_parents(sel_rows[b][: n - 1], par_rows[b], topk)

        retrieve_index[b] = torch.arange(b * n, (b + 1) * n, dtype=retrieve_index.dtype)
        next_token = [-1] * n
        next_sibling = [-1] * n
        for i in range(n - 1, 0, -1):  # walking down means the smallest child ends up first
            p = parent[i]
            if p >= 0:
                next_sibling[i] = next_token[p]
                next_token[p] = i
        retrieve_next_token[b] = torch.tensor(next_token, dtype=retrieve_next_token.dtype)
        retrieve_next_sibling[b] = torch.tensor(next_sibling, dtype=retrieve_next_sibling.dtype)

        if mode == FULL_MASK:
            row_len, base, col0 = sl + n, n * n * b + prefix_sum * n, sl
        else:
            row_len, base, col0 = n, n * n * b, 0
        for x in range(n):
            row = torch.zeros(n, dtype=torch.bool)
            row[0] = True
            level, node = 0, x
            while node > 0 and level < depth:  # climb from x towards the root
                row[node] = True
                level += 1
                node = parent[node]
                if node < 0:
                    break
            start = base + row_len * x + col0
            flat_mask[start : start + n] = row.to(flat_mask.dtype)
            pos[b * n + x] = sl + level
        prefix_sum += sl


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,  # mutated, [bs * n]
    accept_index: torch.Tensor,  # mutated, [bs, num_spec_tokens]
    accept_token_num: torch.Tensor,  # mutated, [bs]
    candidates: torch.Tensor,  # [bs, n]
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,  # [bs, n] (or flat)
) -> None:
    """Greedy tree walk: from the root, descend to the child whose draft token equals
    the target's argmax at the current node; stop when none matches.
    Writes accepted retrieve indices, their count (bonus excluded), and the target
    tokens at every accepted node plus the bonus at the last one."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    target = target_predict.reshape(-1).tolist()
    cand = candidates.tolist()
    ridx = retrive_index.reshape(bs, n).tolist()
    nxt = retrive_next_token.reshape(bs, n).tolist()
    sib = retrive_next_sibling.reshape(bs, n).tolist()
    pred = predicts.view(-1)
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted, node = 0, 0
        for _ in range(1, steps):
            want = target[last]
            child = nxt[b][node]
            while child != -1 and cand[b][child] != want:
                child = sib[b][child]
            if child == -1:
                break
            pred[last] = want
            accepted += 1
            accept_index[b, accepted] = ridx[b][child]
            last, node = ridx[b][child], child
        accept_token_num[b] = accepted
        pred[last] = target[last]
