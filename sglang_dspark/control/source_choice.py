"""Which proposal a request verifies this step, when it has more than one (the drafter's block, a retrieval chain):
Algorithm 1 generalised from "how many drafts" to "which drafts, then how many".

Verifying the first l drafts of a proposal with conditional confidences c gains sum_{j<l} S_j expected accepted
tokens (S = prefix survival, the cumulative product of c) and costs l verify tokens. With `token_price` the cost of
one more verify token in units of accepted tokens (0 on an idle engine, where every token is nearly free; higher
under load), a proposal is worth max_l (sum_{j<l} S_j - token_price * l), and the better one is verified; the
verify-length policy then picks l on its curve as usual. Ties go to the cheaper-to-make proposal (retrieval).
A chain whose confidence cell has hardly been observed is valued at price 0 (optimism under uncertainty): were it
priced out before its first verify outcomes, its cell would never learn.
"""

from __future__ import annotations

import torch


def proposal_value(conf: torch.Tensor, token_price: "float | torch.Tensor" = 0.0) -> torch.Tensor:
    """Float[R]: max over l in [0, G] of sum_{j<l} S_j - token_price * l, for conditional confidences conf [R, G];
    token_price a number or Float[R] (per request)."""
    s = torch.cumprod(conf.float().clamp(0.0, 1.0), dim=1)
    price = token_price.float().view(-1, 1) if isinstance(token_price, torch.Tensor) else token_price
    gain = torch.cumsum(s - price, dim=1)
    return gain.max(dim=1).values.clamp_min(0.0)


def choose_retrieval(drafter_conf: torch.Tensor, drafted: torch.Tensor, retrieval_conf: torch.Tensor,
                     has_chain: torch.Tensor, token_price: float = 0.0,
                     unexplored: torch.Tensor | None = None) -> torch.Tensor:
    """Bool[R]: requests that verify their retrieval chain rather than the drafter's block (a request the drafter
    did not draft has only its chain). drafter_conf, retrieval_conf: Float[R, G] calibrated conditional
    confidences (0 past a chain's end); drafted, has_chain: Bool[R]; unexplored: Bool[R], chains valued at price 0."""
    drafter = torch.where(drafted, proposal_value(drafter_conf, token_price), torch.full_like(drafted, -1.0,
                                                                                               dtype=torch.float32))
    price = token_price
    if unexplored is not None:
        price = torch.where(unexplored, torch.zeros(()), torch.full(unexplored.shape, float(token_price)))
    chain = proposal_value(retrieval_conf, price)
    return has_chain & (chain > 0) & (chain >= drafter)


def skip_drafting(retrieval_conf: torch.Tensor, has_chain: torch.Tensor, drafter_expected: float | None,
                  token_price: float = 0.0) -> torch.Tensor:
    """Bool[R]: requests left out of the draft pass because their chain is worth at least what the drafter's block
    has been worth on average lately (`drafter_expected`, None before the drafter has drafted: skip nobody)."""
    if drafter_expected is None:
        return torch.zeros_like(has_chain)
    return has_chain & (proposal_value(retrieval_conf, token_price) >= drafter_expected)
