"""dspark-async - Section 5.2: capacity from stale confidences, admission by current survival.

An overlapped (zero-overhead / CUDA-graph) scheduler must fix the number of verify tokens K before the current
step's confidences reach the host. So K comes from the confidences of `lag` (= 2) steps earlier: their sorted
survivals stand in for the current ones, and K = argmax_k theta_k over ALL k (no early break - the cost curve
may be jagged, e.g. CUDA-graph buckets, and an argmax finds the far side of a dip). The current step then admits
its top-K candidates by up-to-date survival.

Lossless: K depends only on stale information (independent of the current drafts), and (r, j) is admitted iff
fewer than K candidates rank above it; everything ranked above has survival >= a[r, j], so nothing that depends
on draft j's value is involved. Monotone survival makes the top-K a set of per-request prefixes.
Warm-up (fewer than `lag` past steps): falls back to synchronous Algorithm 1, which is also lossless.
"""

from collections import deque

import torch

from .base import BatchContext, CostModelFeedback, VerifyLengthPolicy, survival
from .dspark import algorithm1, expected_throughput, lengths_from_admitted, ranked_candidates


def resample_sorted(sorted_values: torch.Tensor, count: int) -> torch.Tensor:
    """Stretch/shrink a descending survival curve to `count` candidates (batch size may have changed)."""
    if sorted_values.numel() == count or count == 0 or sorted_values.numel() == 0:
        return sorted_values if sorted_values.numel() == count else sorted_values.new_zeros(count)
    idx = torch.div(torch.arange(count, device=sorted_values.device) * sorted_values.numel(), count,
                    rounding_mode="floor")
    return sorted_values[idx]


def top_k_lengths(conf: torch.Tensor, capacity: int, ranking: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Admit the `capacity` highest-survival candidates (zero-survival ones never). Long[R]."""
    num_rows, gamma = conf.shape
    order, ranked = ranking if ranking is not None else ranked_candidates(survival(conf))
    admitted = min(capacity, int((ranked > 0).sum()))
    return lengths_from_admitted(order, admitted, num_rows, gamma)


class DSparkAsyncPolicy(CostModelFeedback, VerifyLengthPolicy):
    name = "dspark-async"

    def __init__(self, gamma: int, cost_model, lag: int = 2, online_cost_update: bool = True):
        super().__init__(gamma)
        if cost_model is None:
            raise ValueError("dspark-async policy needs a cost model (EngineCostModel)")
        if lag < 1:
            raise ValueError(f"lag must be >= 1, got {lag}")
        self.cost_model = cost_model
        self.online_cost_update = online_cost_update
        self.lag = lag
        self._past_sorted_survival: deque[torch.Tensor] = deque(maxlen=lag)
        self.last_capacity: int | None = None

    def capacity_from(self, stale_sorted_survival: torch.Tensor, num_requests: int, kv_tokens: int,
                      plain_step_s: float | None = None, verify_scale: float = 1.0) -> int:
        """K = argmax over every k of expected throughput, on the stale survival curve (no early break)."""
        ranked = resample_sorted(stale_sorted_survival, num_requests * self.gamma)
        theta = expected_throughput(ranked, num_requests, kv_tokens, self.cost_model, plain_step_s, verify_scale)
        return int(theta.argmax())

    def choose(self, conf: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        conf = conf[:, : self.gamma]
        num_rows = conf.shape[0]
        full = len(self._past_sorted_survival) == self.lag
        stale = self._past_sorted_survival[0] if full else None
        ranking = ranked_candidates(survival(conf))
        self._past_sorted_survival.append(ranking[1].detach().clone())
        if stale is None:
            lengths = algorithm1(conf, num_rows, ctx.kv_tokens, self.cost_model, ctx.plain_step_s, ctx.verify_scale)
            self.last_capacity = int(lengths.sum())
            return lengths
        self.last_capacity = self.capacity_from(stale, num_rows, ctx.kv_tokens, ctx.plain_step_s, ctx.verify_scale)
        return top_k_lengths(conf, self.last_capacity, ranking)
