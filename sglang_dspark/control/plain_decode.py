"""Plain decode vs ragged verify: the whole-batch choice that keeps speculation from costing more than none.

When every l_r = 0 the worker runs SGLang's plain decode forward, which is cheaper than a ragged verify forward
over the same R tokens (no EXTEND path, one logits row per request). The verify cost model only knows verify steps,
so it cannot see that gap. PlainDecodeGate learns it online as rho = measured plain step / predicted verify step at
T = R (EWMA), and replaces a verify plan whose expected goodput is below plain decoding's:

    sum_r E_r(l_r) / t(R + sum l, R, K)   <   R / (rho * t(R, R, K))      ->   every l_r = 0

with E_r(l) = 1 + sum_{j<l} a[r, j] (bonus token included). Lossless: the decision reads confidences only, never
the target's check of the drafts. Until a plain step has been measured rho is unknown and the plan stands.

kappa = measured verify step / predicted verify step (EWMA over verify steps) corrects the linear cost model where
it is locally biased: on the CPU engine the start-up fit under-predicted batch-2 verify steps by ~30% (132 ms
measured vs ~100 ms predicted), which made verifying 0.15-confidence drafts look profitable. Both ratios are
learned at the current operating point, so the comparison plain vs verify is made in measured seconds.

kappa learns only from verify steps, so once it says "verify costs too much" it is never corrected: on a 2-core CPU a
few verify steps slowed by another process (kappa up) followed by normal plain steps (rho back) switched a c = 1
server's speculation off for good (2026-12-04: 3,202 plain-streak peeks in a row turned down, nothing verified for
minutes while a later run of the same load verified throughout). So after EXPLORE_AFTER plans in a row replaced by
plain decoding, the next one is let through: one verify step refreshes kappa (about 1% of the steps of a load where
plain decoding is right, since plans are rare there).
"""

from __future__ import annotations

import torch

from .base import survival
from .source_choice import proposal_value
from .draft_skip import PROBE_FIRST, PROBE_MAX_GAP

# Policies whose verify plans the gate may replace by plain decoding (fixed / threshold keep their lengths exactly:
# they are what A/B measurements ask for).
GATED_POLICIES = ("dspark", "dspark-async", "sps-topk")

RHO_BOUNDS = (0.05, 2.0)  # a measured ratio outside this is a hiccup (GC, first-call compile), not the engine
# Verify steps may really cost several times the start-up profile (a sampled batch's acceptance work, a different
# attention path than profiled): a bound of 2 would drop exactly the ratios kappa exists to learn.
KAPPA_BOUNDS = (0.05, 8.0)
EXPLORE_AFTER = 32  # consecutive overridden plans after which one verify plan is let through to re-measure kappa


def is_gated(controller: str) -> bool:
    """Whether a --dspark-controller spec ("dspark", "fixed:3", ...) runs with the plain-decode gate."""
    return controller.split(":")[0] in GATED_POLICIES


class PlainDecodeGate:
    def __init__(self, rate: float = 0.2, explore_after: int = EXPLORE_AFTER):
        self.rate = rate
        self.explore_after = explore_after
        self.rho: float | None = None
        self.kappa = 1.0
        self.overrides = 0  # verify plans replaced by plain decoding (for logs and tests)
        self.overrides_in_a_row = 0  # since the last verify step was measured
        self.explorations = 0  # plans let through to re-measure kappa

    def observe_plain(self, measured_s: float, predicted_verify_s: float) -> None:
        if measured_s <= 0 or predicted_verify_s <= 0:
            return
        ratio = measured_s / predicted_verify_s
        if not RHO_BOUNDS[0] <= ratio <= RHO_BOUNDS[1]:
            return
        self.rho = ratio if self.rho is None else (1 - self.rate) * self.rho + self.rate * ratio

    def observe_verify(self, measured_s: float, predicted_verify_s: float) -> None:
        """A verify step's measured time against the cost model's prediction for it (made before the step)."""
        if measured_s <= 0 or predicted_verify_s <= 0:
            return
        ratio = measured_s / predicted_verify_s
        self.overrides_in_a_row = 0
        if KAPPA_BOUNDS[0] <= ratio <= KAPPA_BOUNDS[1]:
            self.kappa = (1 - self.rate) * self.kappa + self.rate * ratio

    def expected_goodput(self, lengths: torch.Tensor, conf: torch.Tensor, cost_model, kv_tokens: int) -> float:
        surv = survival(conf)
        take = torch.arange(conf.shape[1]).view(1, -1) < lengths.view(-1, 1)
        tokens = lengths.numel() + float((surv * take).sum())
        verify_s = self.kappa * float(cost_model.predict(int(lengths.numel() + lengths.sum()), lengths.numel(),
                                                         kv_tokens))
        return tokens / verify_s

    def plain_step_s(self, num_requests: int, cost_model, kv_tokens: int) -> float | None:
        """Predicted plain decode step (None until a plain step has been measured)."""
        if self.rho is None or cost_model is None or num_requests == 0:
            return None
        return self.rho * float(cost_model.predict(num_requests, num_requests, kv_tokens))

    def choose(self, lengths: torch.Tensor, conf: torch.Tensor, cost_model, kv_tokens: int) -> torch.Tensor:
        """lengths Long[R] from the policy, conf Float[R, G] calibrated confidences -> lengths or all zeros."""
        if self.rho is None or cost_model is None or int(lengths.sum()) == 0:
            return lengths
        R = lengths.numel()
        plain = R / (self.rho * float(cost_model.predict(R, R, kv_tokens)))
        if plain > self.expected_goodput(lengths, conf.cpu().float(), cost_model, kv_tokens):
            if self.overrides_in_a_row >= self.explore_after:  # kappa has gone unmeasured for long enough
                self.overrides_in_a_row = 0
                self.explorations += 1
                return lengths
            self.overrides += 1
            self.overrides_in_a_row += 1
            return torch.zeros_like(lengths)
        return lengths


PEEK_MIN_VALUE = 0.5  # expected accepted tokens of a retrieval chain that interrupts a plain streak


def peek_worthy(retrieval_conf: torch.Tensor, has_chain: torch.Tensor, min_value: float = PEEK_MIN_VALUE) -> bool:
    """Whether any request's retrieval chain (calibrated conditional confidences Float[R, G], 0 past its end) is
    expected to accept at least `min_value` drafts: then a step of a plain streak is planned after all."""
    if not bool(has_chain.any()):
        return False
    return bool((proposal_value(retrieval_conf[has_chain]) >= min_value).any())


class PlainStreak:
    """While plans keep verifying nothing for the whole batch (the gate choosing plain decoding, or a policy planning
    l_r = 0 everywhere), building them is pure overhead: the retrieval lookups, the draft pass, calibration and the
    policy, step after step, for a plan that verifies nothing (at c = 16 on a 2-core CPU such plain steps ran ~5%
    slower than SGLang's own decode). After `quiet_after` planned steps in a row verified nothing, only probe steps
    plan (`first`, 2 * first, ... up to `max_gap` steps apart), and the rest decode plainly at once. A request
    joining the batch brings the next probe forward to `first` steps after the last plan (a new prompt may copy
    well). A probe that verifies anything ends the streak.

    A skipped step still looks up its retrieval chains, which cost microseconds against a ~100 ms step: a chain
    worth at least `PEEK_MIN_VALUE` expected accepted tokens (a prompt being copied) is planned at once, without a
    draft pass (`peek`). A peek that verifies something ends the streak; one the gate turns down leaves it as it
    was (a peek is not a probe: it must not push the next probe further out)."""

    def __init__(self, quiet_after: int = 4, first: int = PROBE_FIRST, max_gap: int = PROBE_MAX_GAP):
        self.quiet_after, self.first, self.max_gap = quiet_after, first, max_gap
        self.quiet = 0  # planned steps in a row that verified nothing
        self.last_plan = -1
        self.next_plan = 0
        self.skipped = 0  # steps decoded plainly without a plan (for logs and tests)

    def skip(self, step: int, joined: bool = False) -> bool:
        """True: decode this step plainly without planning."""
        if self.quiet < self.quiet_after:
            return False
        if joined:
            self.next_plan = min(self.next_plan, self.last_plan + self.first)
        if step >= self.next_plan:
            return False
        self.skipped += 1
        return True

    def observe_peek(self, verified_tokens: int) -> None:
        """A step planned because a skipped step's retrieval chain looked worth it (see `peek_worthy`)."""
        self.skipped -= 1  # it was counted as skipped, then planned after all
        if verified_tokens > 0:
            self.quiet, self.next_plan = 0, 0

    def observe(self, step: int, verified_tokens: int) -> None:
        """A planned step: how many drafts it verified (0 when the gate or the policy chose plain decoding)."""
        self.last_plan = step
        if verified_tokens > 0:
            self.quiet, self.next_plan = 0, 0
            return
        self.quiet += 1
        backoffs = self.quiet - self.quiet_after  # probes so far in this streak: the gap doubles with each
        if backoffs >= 0:
            self.next_plan = step + min(self.first << min(backoffs, self.max_gap.bit_length()), self.max_gap)
