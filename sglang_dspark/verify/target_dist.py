"""The target distribution a serving engine samples from, per verify row, from raw logits.

Rejection sampling is lossless only against the distribution plain decoding would draw from, so this mirrors the
usual pipeline in order: additive penalties / logit bias, multiplicative (repetition) penalties, temperature,
softmax, top-k, top-p (cumulative mass taken on the sorted probabilities before top-k zeroing), min-p, renormalise.
Greedy rows (top_k == 1) become one-hot at the argmax of the processed logits.
"""

from __future__ import annotations

import torch


def process_logits(logits: torch.Tensor, additive: torch.Tensor | None = None,
                   scaling: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """logits [T, V] (+ additive penalties [T, V], repetition scaling [T, V], logit_bias [T, V]) -> fp32
    processed logits, in SGLang's order: penalties, then scaling, then the request's logit_bias."""
    out = logits.float()
    if additive is not None:
        out = out + additive.float()
    if scaling is not None:
        # Repetition penalty: divide positive logits, multiply negative ones.
        out = torch.where(out > 0, out / scaling.float(), out * scaling.float())
    if bias is not None:
        out = out + bias.float()
    return out


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                 min_p: torch.Tensor | None = None) -> torch.Tensor:
    """Processed logits [T, V]; temperature/top_p/min_p [T] float, top_k [T] int -> probabilities [T, V] fp32."""
    T, V = logits.shape
    greedy = top_k.view(-1) == 1
    probs = torch.softmax(logits / temperature.view(-1, 1).float().clamp_min(1e-6), dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_p.cumsum(-1) - sorted_p
    rank = torch.arange(V, device=logits.device).view(1, -1)
    keep = (rank < top_k.view(-1, 1).clamp(min=1)) & (mass_before <= top_p.view(-1, 1).float())
    if min_p is not None:
        keep &= sorted_p >= sorted_p[:, :1] * min_p.view(-1, 1).float()
    keep[:, 0] = True  # the most likely token always survives
    sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    sorted_p = sorted_p / sorted_p.sum(-1, keepdim=True)
    out = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    if bool(greedy.any()):
        onehot = torch.zeros_like(out).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        out = torch.where(greedy.view(-1, 1), onehot, out)
    return out
