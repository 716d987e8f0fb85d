"""sps-topk - the comparison baseline (upstream-style budgeted top-k), NOT DSpark.

Budget k = argmax_k (R + sum of the top-k current survivals) * SPS(R + k), with SPS taken from a batch-token
table only (SPS indexed by tokens in the forward; with a cost model, evaluated with no KV term), then the top-k
candidates are split across requests. Differences from `dspark`: no context-length (KV) term in the cost, and an
argmax over all k of the CURRENT step's survivals - which looks at a[r, j+1] (a function of draft j) when
deciding whether to verify draft j, so it is not strictly lossless (see dspark.py). Kept only to compare against.
"""

import torch

from .base import BatchContext, VerifyLengthPolicy, survival
from .dspark import expected_throughput, lengths_from_admitted, ranked_candidates


class _TableCost:
    """Adapts an SPS-by-batch-tokens table to the cost-model interface used by expected_throughput."""

    def __init__(self, sps_table: torch.Tensor):
        self.table = sps_table.double()

    def sps(self, tokens, num_requests, kv_tokens):
        idx = tokens.long().clamp(0, self.table.numel() - 1)
        return self.table.to(tokens.device)[idx]


class _NoKvCost:
    def __init__(self, cost_model):
        self.cost_model = cost_model

    def sps(self, tokens, num_requests, kv_tokens):
        return self.cost_model.sps(tokens, num_requests, 0)


class SpsTopKPolicy(VerifyLengthPolicy):
    name = "sps-topk"

    def __init__(self, gamma: int, sps_table: torch.Tensor | None = None, cost_model=None):
        super().__init__(gamma)
        if sps_table is None and cost_model is None:
            raise ValueError("sps-topk needs an SPS table (index = batch tokens) or a cost model")
        self.cost = _TableCost(sps_table) if sps_table is not None else _NoKvCost(cost_model)

    def choose(self, conf: torch.Tensor, ctx: BatchContext) -> torch.Tensor:
        conf = conf[:, : self.gamma]
        num_rows, gamma = conf.shape
        order, ranked = ranked_candidates(survival(conf))
        theta = expected_throughput(ranked, num_rows, 0, self.cost)
        return lengths_from_admitted(order, int(theta.argmax()), num_rows, gamma)
