"""Shared types for verify-length policies: what a policy sees, what it returns, what it learns from."""

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class BatchContext:
    """What the worker knows about the batch when it picks verify lengths (never any token values).

    kv_lens: Long[R] committed context length per request (sum = KV tokens the target attends over).
    temperatures / min_user_tps / priorities: optional Float[R]; min_user_tps drives SLA mode.
    true_accept_lens: simulator only (oracle policy): drafts the target would accept if all G were verified.
    plain_step_s: what a step verifying nothing costs when it runs as a plain decode step (cheaper than a verify
    forward over the R anchors); theta_0 of Algorithm 1 uses it, since that is the real alternative.
    """

    num_requests: int
    kv_lens: torch.Tensor
    last_step_time_s: float | None = None
    temperatures: torch.Tensor | None = None
    min_user_tps: torch.Tensor | None = None
    priorities: torch.Tensor | None = None
    step_index: int = 0
    true_accept_lens: torch.Tensor | None = None
    plain_step_s: float | None = None  # predicted plain-decode step (worker's fast path); None: not available
    verify_scale: float = 1.0  # measured / predicted verify step time at the current operating point

    @property
    def kv_tokens(self) -> int:
        return int(self.kv_lens.sum())


@dataclass
class StepOutcome:
    """What happened after verification: fed back so policies can refine cost / calibration estimates."""

    verify_lens: torch.Tensor
    accept_lens: torch.Tensor
    step_time_s: float
    kv_lens: torch.Tensor

    @property
    def batch_tokens(self) -> int:
        # every request forwards its anchor plus its verified drafts
        return int(self.verify_lens.numel() + self.verify_lens.sum())


class VerifyLengthPolicy(ABC):
    """Maps calibrated per-position acceptance probabilities conf[R, G] to verify lengths in [0, G].

    conf[r, j] = P(draft j accepted | drafts < j accepted). Lossless policies decide whether to verify draft j of
    request r only from information that does not depend on draft j's value (see dspark.py).
    """

    name: str = "base"

    def __init__(self, gamma: int):
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.gamma = gamma

    @abstractmethod
    def choose(self, conf: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        """Return Long[R] verify lengths in [0, G]."""

    def observe(self, outcome: StepOutcome) -> None:
        """Learn from a finished step (default: nothing to learn)."""


def survival(conf: torch.Tensor) -> torch.Tensor:
    """a[r, j] = prod_{i<=j} conf[r, i]: probability that drafts 0..j of request r are all accepted."""
    return torch.cumprod(conf.float().clamp(0.0, 1.0), dim=1)


class CostModelFeedback:
    """Mixin: a cost-model-driven policy refines its cost model from every observed step."""

    cost_model = None
    online_cost_update: bool = True

    def observe(self, outcome: StepOutcome) -> None:
        if self.cost_model is not None and self.online_cost_update and outcome.step_time_s > 0:
            self.cost_model.update(
                outcome.batch_tokens, outcome.verify_lens.numel(), int(outcome.kv_lens.sum()), outcome.step_time_s
            )
