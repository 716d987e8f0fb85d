"""oracle - simulator-only upper bound: knows how many drafts the target will accept.

true_accept_lens[r] = drafts the target would accept if all G were verified (fixed randomness). Verifying
l <= A[r] yields l + 1 tokens, more is waste, so realised tokens depend only on the total L = sum l_r <= sum A:
pick L* = argmax_L (R + L) * SPS(R + L) and hand it out without exceeding any A[r] (request order; every split
with l_r <= A_r realises the same goodput). Pass the lengths via ctx.true_accept_lens or set_true_accept_lens().
"""

import torch

from .base import BatchContext, CostModelFeedback, VerifyLengthPolicy


class OraclePolicy(CostModelFeedback, VerifyLengthPolicy):
    name = "oracle"

    def __init__(self, gamma: int, cost_model, online_cost_update: bool = False):
        super().__init__(gamma)
        if cost_model is None:
            raise ValueError("oracle policy needs a cost model (EngineCostModel)")
        self.cost_model = cost_model
        self.online_cost_update = online_cost_update
        self._true_accept_lens: torch.Tensor | None = None

    def set_true_accept_lens(self, accept_lens: torch.Tensor) -> None:
        self._true_accept_lens = accept_lens

    def choose(self, conf: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        truth = ctx.true_accept_lens if ctx.true_accept_lens is not None else self._true_accept_lens
        if truth is None:
            raise ValueError("oracle policy needs true accept lengths (ctx.true_accept_lens or set_true_accept_lens)")
        usable = truth.to(torch.long).clamp(0, self.gamma)
        num_rows = usable.numel()
        totals = torch.arange(int(usable.sum()) + 1, dtype=torch.float64)
        goodput = (num_rows + totals) * self.cost_model.sps(num_rows + totals, num_rows, ctx.kv_tokens)
        budget = int(goodput.argmax())
        before = torch.cumsum(usable, 0) - usable  # drafts granted to earlier requests
        return (budget - before).clamp(min=0).minimum(usable)
