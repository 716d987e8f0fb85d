"""threshold:c - verify each request's drafts while the confidence stays at or above c.

mode="survival" (default): verify j while prod_{i<=j} conf >= c (prefix survival, the cumulative variant).
mode="position": verify j while every conf[i<=j] >= c (DeepSpec eval's static `--confidence-threshold` rule).
Both are lossless: draft j's inclusion depends on conf[:j+1], which never depends on draft j's own value.
"""

import torch

from .base import BatchContext, VerifyLengthPolicy, survival

MODES = ("survival", "position")


class ThresholdPolicy(VerifyLengthPolicy):
    name = "threshold"

    def __init__(self, gamma: int, threshold: float, mode: str = "survival"):
        super().__init__(gamma)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.threshold = threshold
        self.mode = mode

    def choose(self, conf: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        conf = conf[:, : self.gamma]
        score = survival(conf) if self.mode == "survival" else conf.float()
        keep = score >= self.threshold
        return torch.cumprod(keep.long(), dim=1).sum(dim=1)
