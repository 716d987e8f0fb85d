"""Per-request DSpark state riding on `batch.spec_info` between steps (SGLang filters / merges it with the batch)."""

from __future__ import annotations

import torch
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType


class DSparkDraftState(SpecInput):
    """anchors[r]: the last emitted token of request r (sampled by the target, not yet in its KV).
    zero_streak[r]: consecutive steps drafting for r did not pay (drives draft skipping, control/draft_skip.py).
    savings[r]: smoothed target time r's verification saved per drafted step (NaN: not drafted yet;
    control/draft_value.py)."""

    def __init__(self, anchors: torch.Tensor, zero_streak: torch.Tensor | None = None,
                 savings: torch.Tensor | None = None):
        super().__init__(SpecInputType.DFLASH_DRAFT)
        self.anchors = anchors
        n = len(anchors)
        self.zero_streak = zero_streak if zero_streak is not None else torch.zeros(n, dtype=torch.int64)
        self.savings = savings if savings is not None else torch.full((n,), float("nan"), dtype=torch.float64)

    def filter_batch(self, new_indices: torch.Tensor, new_indices_cpu=None, **_) -> None:
        self.anchors = self.anchors[new_indices.to(self.anchors.device)]
        self.zero_streak = self.zero_streak[new_indices.cpu()]
        self.savings = self.savings[new_indices.cpu()]

    def merge_batch(self, other: "DSparkDraftState") -> None:
        self.anchors = torch.cat([self.anchors, other.anchors.to(self.anchors.device)])
        self.zero_streak = torch.cat([self.zero_streak, other.zero_streak])
        self.savings = torch.cat([self.savings, other.savings])
