"""Per-request DSpark state riding on `batch.spec_info` between steps (SGLang filters / merges it with the batch)."""

from __future__ import annotations

import torch
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType


class DSparkDraftState(SpecInput):
    """anchors[r]: the last emitted token of request r (sampled by the target, not yet in its KV)."""

    def __init__(self, anchors: torch.Tensor):
        super().__init__(SpecInputType.DFLASH_DRAFT)
        self.anchors = anchors

    def filter_batch(self, new_indices: torch.Tensor, new_indices_cpu=None, **_) -> None:
        self.anchors = self.anchors[new_indices.to(self.anchors.device)]

    def merge_batch(self, other: "DSparkDraftState") -> None:
        self.anchors = torch.cat([self.anchors, other.anchors.to(self.anchors.device)])
