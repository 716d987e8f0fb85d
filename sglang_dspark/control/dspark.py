"""dspark - Algorithm 1 of the DSpark paper: hardware-aware global prefix scheduling, vectorised.

Every request forwards its anchor, so with nothing admitted the batch costs T = R tokens and yields tau = R
tokens. Candidates (r, j) are admitted in descending order of survival a[r, j] = prod_{i<=j} conf[r, i]; each
adds one token to T and a[r, j] expected tokens to tau. Expected throughput after k admissions is
    theta_k = (R + sum of the top-k survivals) * SPS(R + k, R, KV).
We stop at the FIRST k whose theta does not improve on theta_{k-1}.

Why the early break (and not an argmax over k): a[r, j+1] = a[r, j] * conf[r, j+1] and conf[r, j+1] depends on
draft j's value. Candidates are visited in descending survival, so when (r, j) is decided only candidates with
survival >= a[r, j] have been seen - none of which depend on draft j. Hence "verify draft j" never depends on
draft j's value and rejection sampling stays exactly lossless. An argmax over all k also looks at a[r, j+1..]
(e.g. a confident continuation pulls the capacity up to include j), which biases which values of draft j get
verified (Appendix A of the paper; see tests/unit/test_control_dspark.py for a constructed counterexample).
Monotone survival plus a stable sort (ties keep flat index order r*G + j) means admitted sets are per-request
prefixes, so the length of request r is simply how many of its candidates were admitted.
"""

import torch

from .base import BatchContext, CostModelFeedback, VerifyLengthPolicy, survival
from .sla import apply_sla


def ranked_candidates(surv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat candidate indices sorted by survival (desc, stable) and their survival values."""
    flat = surv.reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)
    return order, flat[order]


def expected_throughput(sorted_surv: torch.Tensor, num_requests: int, kv_tokens: int, cost_model,
                        plain_step_s: float | None = None, verify_scale: float = 1.0) -> torch.Tensor:
    """theta[k] for k = 0..n admitted candidates (k = 0: anchors only). Float64[n + 1].

    The drafts are already paid for when this runs, so only verification is priced (whether drafting pays is
    decided afterwards, control/draft_value.py). With `plain_step_s`, k = 0 is a plain decode step."""
    tau = num_requests + torch.cat([sorted_surv.new_zeros(1), sorted_surv.cumsum(0)]).double()
    tokens = num_requests + torch.arange(sorted_surv.numel() + 1, device=sorted_surv.device, dtype=torch.float64)
    step_s = verify_scale / cost_model.sps(tokens, num_requests, kv_tokens)
    theta = tau / step_s
    if plain_step_s is not None and plain_step_s > 0:
        theta[0] = num_requests / plain_step_s
    return theta


def first_non_improvement(theta: torch.Tensor, ranked: torch.Tensor) -> int:
    """Admissions before the first k with theta[k] <= theta[k-1] or zero survival (Algorithm 1's break).

    One device->host sync; a zero-survival candidate can never add expected tokens, so it also stops the scan.
    """
    stop = (theta[1:] <= theta[:-1]) | (ranked <= 0)
    stop = torch.cat([stop, stop.new_ones(1)])  # sentinel: admitting everything is allowed
    return int(stop.int().argmax())


def lengths_from_admitted(order: torch.Tensor, num_admitted: int, num_requests: int, gamma: int) -> torch.Tensor:
    rows = torch.div(order[:num_admitted], gamma, rounding_mode="floor")
    return torch.bincount(rows, minlength=num_requests).to(torch.long)


def algorithm1(conf: torch.Tensor, num_requests: int, kv_tokens: int, cost_model,
               plain_step_s: float | None = None, verify_scale: float = 1.0) -> torch.Tensor:
    """Verify lengths Long[R] chosen by Algorithm 1 (with the lossless early break)."""
    num_rows, gamma = conf.shape
    if num_rows == 0 or gamma == 0:
        return torch.zeros(num_rows, dtype=torch.long, device=conf.device)
    order, ranked = ranked_candidates(survival(conf))
    theta = expected_throughput(ranked, num_requests, kv_tokens, cost_model, plain_step_s, verify_scale)
    return lengths_from_admitted(order, first_non_improvement(theta, ranked), num_rows, gamma)


class DSparkPolicy(CostModelFeedback, VerifyLengthPolicy):
    """Algorithm 1; with ctx.min_user_tps set, SLA mode tops up requests below their floor (see sla.py)."""

    name = "dspark"

    def __init__(self, gamma: int, cost_model, online_cost_update: bool = True):
        super().__init__(gamma)
        if cost_model is None:
            raise ValueError("dspark policy needs a cost model (EngineCostModel)")
        self.cost_model = cost_model
        self.online_cost_update = online_cost_update
        self.last_unsatisfied: torch.Tensor | None = None  # Bool[R] from SLA mode, for metrics

    def choose(self, conf: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        conf = conf[:, : self.gamma]
        lengths = algorithm1(conf, conf.shape[0], ctx.kv_tokens, self.cost_model, ctx.plain_step_s,
                             ctx.verify_scale)
        self.last_unsatisfied = None
        if ctx.min_user_tps is not None:
            sla = apply_sla(lengths, survival(conf), ctx.min_user_tps, ctx.kv_tokens, self.cost_model)
            lengths, self.last_unsatisfied = sla.lengths, sla.unsatisfied
        return lengths
