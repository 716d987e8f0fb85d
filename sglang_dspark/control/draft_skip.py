"""When to re-probe a request the controller keeps at l = 0 (draft skipping).

A request whose last `streak` steps verified nothing is not drafted for, except on probe steps: streak = first,
2*first, 4*first, ... up to max_gap, then every max_gap steps. A probe costs a draft pass; backing off
exponentially makes the probe cost vanish under sustained load (a fixed interval of 4 cost 12-18% of throughput at
c >= 4 on the CPU engine, BENCHMARKS.md), while a request whose drafts become worth verifying is found again within
max_gap steps.
"""

import torch

PROBE_FIRST, PROBE_MAX_GAP = 4, 32  # re-probe after 4, 8, 16, 32, then every 32 steps


def probe_due(streak: torch.Tensor, first: int = PROBE_FIRST,
              max_gap: int = PROBE_MAX_GAP) -> torch.Tensor:
    """streak Long[R] (consecutive l = 0 steps) -> Bool[R]: draft for this request this step."""
    s = streak.long()
    power_of_two_multiple = (s >= first) & (s % first == 0) & (((s // first) & (s // first - 1)) == 0)
    periodic = (s >= max_gap) & (s % max_gap == 0)
    return (s == 0) | power_of_two_multiple | periodic
