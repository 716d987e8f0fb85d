"""Was drafting for a request worth its draft pass this step? (drives draft skipping; see draft_skip.py)

Two decisions, two prices. Once the drafts exist their cost is sunk, so the verify length is chosen on verify cost
alone (Algorithm 1, dspark.py). Whether to draft for a request again is a separate question: drafting pays when
verification saves more target time than the draft pass costs. Per request, this step's saving is

    saved_r = E_r * t_plain / R  -  (t_verify - t_plain) * l_r / L

E_r = sum_{j < l_r} a[r, j] (expected accepted drafts), t_plain / R the time a plain step spends per token,
L = sum_r l_r (the verify step's extra time is shared by verified tokens). The savings are smoothed per request over
the steps it was drafted on (one doubtful draft does not stop drafting for a request whose drafts usually pay). A
request whose smoothed saving does not exceed its share of the draft pass counts as a zero step for the probe
schedule, exactly like one verified at l = 0 under the other policies.

Why not charge the next draft inside Algorithm 1 (the rule before 2026-11-30's paired A/Bs): that priced each verify as if
the draft were still to be paid, so on this CPU at one request (draft ~17 ms, plain step ~110 ms, a 1-token verify
~3 ms more) a draft had to survive with ~0.2 probability before anything was verified, and the drafts paid for on
the other steps went unverified (docs/benchmark-log.md, 2026-11-30, "Light load").
"""

from __future__ import annotations

import torch

from .base import survival

# Policies whose draft skipping uses this rule; fixed / threshold / sps-topk keep "verified something" (baselines).
PRICED_DRAFTING_POLICIES = ("dspark", "dspark-async")


def verification_savings(lengths: torch.Tensor, conf: torch.Tensor, plain_step_s: float,
                         verify_step_s: float) -> torch.Tensor:
    """Float64[R]: expected target time (s) each request's verification saves against plain decoding."""
    R = lengths.numel()
    total = int(lengths.sum())
    if R == 0 or total == 0:
        return torch.zeros(R, dtype=torch.float64)
    take = torch.arange(conf.shape[1]).view(1, -1) < lengths.view(-1, 1)
    expected = (survival(conf.double()) * take).sum(-1)
    extra = max(verify_step_s - plain_step_s, 0.0)
    return expected * (plain_step_s / R) - extra * lengths.double() / total


def step_prices(cost_model, gate, num_requests: int, verified: int, kv_tokens: int) -> tuple[float, float]:
    """(plain step s, verify step s) as the controller prices them at this operating point: the plain-decode gate's
    measured plain/verify ratio when it has one (control/plain_decode.py), its kappa on the verify prediction."""
    plain = gate.plain_step_s(num_requests, cost_model, kv_tokens) if gate is not None else None
    if plain is None:
        plain = float(cost_model.predict(num_requests, num_requests, kv_tokens))
    kappa = 1.0 if gate is None else gate.kappa
    return plain, kappa * float(cost_model.predict(num_requests + verified, num_requests, kv_tokens))


SAVINGS_RATE = 0.3  # EWMA weight of the newest drafted step


def smoothed_savings(previous: torch.Tensor, saved: torch.Tensor, drafted: torch.Tensor,
                     rate: float = SAVINGS_RATE) -> torch.Tensor:
    """Float64[R] per-request EWMA of verification_savings over the steps it was drafted on (NaN: none yet, the
    first observation is taken as is). Requests not drafted this step keep their value."""
    prev = previous.double()
    blended = torch.where(torch.isnan(prev), saved, (1 - rate) * prev + rate * saved)
    return torch.where(drafted, blended, prev)


def drafting_pays(previous: torch.Tensor, lengths: torch.Tensor, conf: torch.Tensor, drafted: torch.Tensor,
                  plain_step_s: float, verify_step_s: float,
                  draft_s_per_request: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of the rule for the requests drafted this step: (Bool[R] smoothed savings above the request's share
    of the draft pass, the new smoothed savings Float64[R]). Undrafted requests are never "paying"."""
    savings = smoothed_savings(previous, verification_savings(lengths, conf, plain_step_s, verify_step_s), drafted)
    return drafted & (savings > draft_s_per_request), savings
