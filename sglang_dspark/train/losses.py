"""DSpark training losses (reference §4.5), all at softmax temperature 1 in fp32.

w[j,k] = eval_mask[j,k] * exp(-k / gamma)
CE   = sum w * -log p_d(y)          / sum w
L1   = sum w * ||p_d - p_t||_1       / sum w     (= 2 TV)
Conf = sum w * BCE(conf_logit, c*)   / sum w     c* = clamp(1 - 0.5 ||p_d - p_t||_1, 0, 1), detached
loss = ce_weight * CE + l1_weight * L1 + conf_weight * Conf     (DSpark: 0.1 / 0.9 / 1.0; DFlash: 1 / 0 / 0)
`denom` lets gradient accumulation divide by the global weight sum of the whole optimizer step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def position_weights(block_size: int, gamma: float = 4.0, device=None) -> torch.Tensor:
    return torch.exp(-torch.arange(block_size, device=device, dtype=torch.float32) / gamma)


def loss_weights(eval_mask: torch.Tensor, gamma: float = 4.0) -> torch.Tensor:
    return eval_mask.float() * position_weights(eval_mask.shape[-1], gamma, eval_mask.device)


def block_positions(anchors: torch.Tensor, block_size: int, seq_len: int) -> torch.Tensor:
    """Sequence position whose target distribution supervises slot k of block j: anchor_j + k (clamped)."""
    return (anchors[..., None] + torch.arange(block_size, device=anchors.device)).clamp(max=seq_len - 1)


def target_block_logits(lm_head, last_hidden: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """Target logits for slot k of block j: lm_head(last_hidden[anchor_j + k]) -> [b, N, B, V] fp32."""
    b, S, d = last_hidden.shape
    pos = block_positions(anchors, block_size, S)
    h = last_hidden.gather(1, pos.reshape(b, -1, 1).expand(-1, -1, d))
    with torch.no_grad():
        return lm_head(h.to(lm_head.weight.dtype)).float().view(b, anchors.shape[1], block_size, -1)


def target_argmax(sample, tlogits, anchors, block_size: int, seq_len: int, max_length: int) -> torch.Tensor:
    """The target's greedy token for every block slot [1, N, B]: what the server's verification accepts at T = 0
    (the capture pass's top-1 from the cache's target statistics when `tlogits` is None)."""
    if tlogits is not None:
        return tlogits.argmax(-1)
    pos = block_positions(anchors[0], block_size, seq_len)
    return sample["topk_ids"][:max_length, 0].long().to(pos.device)[pos][None]


def candidate_vocab(target_logits: torch.Tensor | None, labels: torch.Tensor, top_k: int, negatives: int,
                    generator: torch.Generator | None = None, top_ids: torch.Tensor | None = None,
                    vocab_size: int | None = None) -> torch.Tensor:
    """Sorted token ids for a sampled-vocabulary step: every position's target top-k, every label, and `negatives`
    uniform random ids (so mass the drafter puts elsewhere keeps getting pushed down across steps).
    `top_ids` (precomputed top ids, descending, [..., >= top_k]) with `vocab_size` replaces `target_logits`."""
    if top_ids is not None:
        V, top = vocab_size, top_ids[..., :top_k].flatten().long()
    else:
        V, top = target_logits.shape[-1], target_logits.topk(top_k, dim=-1).indices.flatten()
    neg = torch.randint(0, V, (negatives,), generator=generator).to(top.device)
    return torch.unique(torch.cat([top, labels.flatten().long().to(top.device), neg]))


def dspark_losses(draft_logits, target_logits, conf_logits, labels, eval_mask, ce_weight: float = 0.1,
                  l1_weight: float = 0.9, conf_weight: float = 1.0, gamma: float = 4.0,
                  denom: float | torch.Tensor | None = None, vocab: torch.Tensor | None = None,
                  target_probs: torch.Tensor | None = None):
    """-> (loss, stats). stats holds the three means, the weight sum and a soft acceptance 1 - TV (for logs).

    With `vocab` (sorted ids, see candidate_vocab) draft_logits cover only those columns: the draft distribution
    is renormalised over them, and the target mass outside them counts fully into L1 (a constant for the gradient,
    but it keeps the logged TV honest). `target_probs` (exact target probabilities of those same columns, from
    target_stats.target_probs) replaces `target_logits`, which may then be None."""
    w = loss_weights(eval_mask, gamma)
    wsum = w.sum()
    denom = wsum.clamp_min(1e-6) if denom is None else denom
    logp_d = torch.log_softmax(draft_logits.float(), dim=-1)
    if target_probs is not None:
        p_t = target_probs.float()
    else:
        p_t = torch.softmax(target_logits.float(), dim=-1)
        if vocab is not None:
            p_t = p_t[..., vocab]
    if vocab is not None:
        labels = torch.searchsorted(vocab, labels.long().contiguous())
    ce = -(logp_d.gather(-1, labels[..., None].long()).squeeze(-1))
    l1 = (logp_d.exp() - p_t).abs().sum(-1)
    if vocab is not None:
        l1 = l1 + (1 - p_t.sum(-1)).clamp_min(0)
    soft_label = (1 - 0.5 * l1.detach()).clamp(0, 1)
    if conf_weight:
        conf = F.binary_cross_entropy_with_logits(conf_logits.float(), soft_label, reduction="none")
    else:  # no confidence head (DFlash ablation): the term is absent, not a constant ln 2
        conf = torch.zeros_like(soft_label)
    ce_m, l1_m, conf_m = (w * ce).sum() / denom, (w * l1).sum() / denom, (w * conf).sum() / denom
    loss = ce_weight * ce_m + l1_weight * l1_m + conf_weight * conf_m
    with torch.no_grad():
        m = eval_mask.float()
        n = m.sum().clamp_min(1)
        stats = {"ce": ce_m.item(), "l1": l1_m.item(), "conf": conf_m.item(), "weight": wsum.item(),
                 "accept_soft": ((soft_label * m).sum() / n).item(),
                 "top1": (((draft_logits.argmax(-1) == labels).float() * m).sum() / n).item()}
    return loss, stats
