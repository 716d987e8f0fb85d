"""fixed:k - verify the first k drafts of every request (classic static speculative decoding)."""

import torch

from .base import BatchContext, VerifyLengthPolicy


class FixedPolicy(VerifyLengthPolicy):
    name = "fixed"

    def __init__(self, gamma: int, length: int):
        super().__init__(gamma)
        if length < 0:
            raise ValueError(f"fixed length must be >= 0, got {length}")
        self.length = min(length, gamma)  # clipped to the draft width

    def choose(self, conf: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        return torch.full((conf.shape[0],), self.length, dtype=torch.long, device=conf.device)
