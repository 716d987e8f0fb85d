"""Offline acceptance on the held-out split: what a learning curve plots against blocks trained.

For each held-out block, greedy verification over the full vocabulary accepts draft k while every draft up to k is
the target's argmax. The target's argmax at slot k comes from the cache's target statistics (the capture pass's
top-1) when they exist, else from the target's lm_head on the captured final hidden state. A block's chain also
stops where the text itself leaves the target's argmax: beyond that point the cached context is not the one the
server would be drafting from. On greedy target generations the two agree and this is the T = 0 acceptance length
under full-block verification; on other text it is a lower bound.
"""

from __future__ import annotations

import torch

from ..drafter import sample_anchors
from .losses import block_positions, target_argmax


def greedy_chain_lengths(draft: torch.Tensor, target_top: torch.Tensor, labels: torch.Tensor,
                         valid: torch.Tensor) -> torch.Tensor:
    """Accepted drafts per block [..., B] -> [...]: the longest prefix where the draft is the target's argmax and
    the text (labels) is too, inside the valid prefix."""
    hit = (draft == target_top) & (labels == target_top) & valid
    return hit.long().cumprod(-1).sum(-1)


@torch.no_grad()
def heldout_acceptance(model, cache, indices: list[int], num_anchors: int = 64, max_length: int = 1024,
                       seed: int = 0, device: torch.device | str = "cpu") -> dict:
    """-> {"tau": mean accepted drafts + 1, "top1": first-draft acceptance, "blocks": blocks evaluated}."""
    was_training = model.training
    model.eval()
    B = model.block_size
    accepted = first = blocks = 0.0
    for n, idx in enumerate(indices):
        s = cache[idx]
        ids = s["input_ids"][:max_length].long()[None].to(device)
        lm = s["loss_mask"][:max_length][None].to(device)
        anchors, keep = sample_anchors(lm, num_anchors, torch.Generator().manual_seed(seed * 1_000_003 + n))
        if not bool(keep.any()):
            continue
        hidden = s["hidden"][:max_length][None].to(device, torch.float32)
        logits, _, labels, emask = model.forward_train(ids, hidden, lm, anchors, keep)
        if "topk_ids" in s and s["topk_ids"] is not None:
            target_top = target_argmax(s, None, anchors, B, ids.shape[1], max_length)
        else:
            pos = block_positions(anchors[0], B, ids.shape[1])
            last = s["last_hidden"][:max_length].to(device, model.lm_head.weight.dtype)
            target_top = model.lm_head(last[pos]).argmax(-1)[None]
        chain = greedy_chain_lengths(logits.argmax(-1), target_top, labels, emask)[0][keep[0]]
        accepted += float(chain.sum())
        first += float((chain > 0).sum())
        blocks += float(keep.sum())
    if was_training:
        model.train()
    if blocks == 0:
        return {"tau": float("nan"), "top1": float("nan"), "blocks": 0}
    return {"tau": 1.0 + accepted / blocks, "top1": first / blocks, "blocks": int(blocks)}
