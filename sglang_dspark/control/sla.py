"""SLA mode: requests with a minimum user tokens/s floor get extra verify tokens when Algorithm 1 left them short.

Expected tokens/step of request r verifying l drafts: E_r(l) = 1 + sum_{j<l} a[r, j]; its expected user rate
is E_r(l) * SPS(T). A floored request is topped up to the smallest l with E_r(l) >= floor_r / SPS(T_hi), where
T_hi charges every floored request its full width G (a conservative, upper-bound batch size, so SPS(T_hi) <=
the SPS we will really get when cost grows with T). Requests that still miss their floor at the realised T
(even l = G is not enough, or a jagged cost curve bit) are reported as unsatisfied.

Still lossless: draft j of r is added iff E_r(j) < floor_r / SPS(T_hi). E_r(j) uses a[r, <j] only, and T_hi
uses the base lengths of the other requests, which - whenever Algorithm 1 did not already admit (r, j) - were
fixed by candidates ranked above (r, j), none of which depend on draft j.
"""

from dataclasses import dataclass

import torch


@dataclass
class SlaResult:
    lengths: torch.Tensor  # Long[R] verify lengths after top-up
    unsatisfied: torch.Tensor  # Bool[R] floored requests whose expected user rate is still below their floor
    expected_user_tps: torch.Tensor  # Float[R] expected tokens/s per request at the final lengths


def expected_tokens_per_step(surv: torch.Tensor) -> torch.Tensor:
    """E[r, l] = 1 + sum_{j<l} a[r, j] for l = 0..G. Float64[R, G+1]."""
    zeros = surv.new_zeros(surv.shape[0], 1)
    return 1.0 + torch.cat([zeros, surv.cumsum(1)], dim=1).double()


def apply_sla(
    lengths: torch.Tensor, surv: torch.Tensor, min_user_tps: torch.Tensor, kv_tokens: int, cost_model
) -> SlaResult:
    num_rows, gamma = surv.shape
    floors = torch.nan_to_num(min_user_tps.double().to(surv.device), nan=0.0)
    floored = floors > 0
    expected = expected_tokens_per_step(surv)
    if bool(floored.any()):
        t_hi = num_rows + torch.where(floored, torch.full_like(lengths, gamma), lengths).sum()
        need = floors / float(cost_model.sps(int(t_hi), num_rows, kv_tokens))  # tokens/step each floor needs
        required = (expected[:, :gamma] < need.unsqueeze(1)).sum(1)  # smallest l with E(l) >= need (<= G)
        lengths = torch.where(floored, torch.maximum(lengths, required), lengths)
    unsatisfied, user_tps = unmet_floors(lengths, surv, min_user_tps, kv_tokens, cost_model)
    return SlaResult(lengths=lengths, unsatisfied=unsatisfied, expected_user_tps=user_tps)


def unmet_floors(lengths: torch.Tensor, surv: torch.Tensor, min_user_tps: torch.Tensor, kv_tokens: int, cost_model):
    """For any policy's lengths: (Bool[R] floored requests whose expected tokens/s at the realised step is below
    their floor, Float[R] that expected rate)."""
    num_rows = surv.shape[0]
    floors = torch.nan_to_num(min_user_tps.double().to(surv.device), nan=0.0)
    realised_sps = float(cost_model.sps(int(num_rows + lengths.sum()), num_rows, kv_tokens))
    user_tps = expected_tokens_per_step(surv).gather(1, lengths.long().unsqueeze(1)).squeeze(1) * realised_sps
    return (floors > 0) & (user_tps < floors), user_tps
