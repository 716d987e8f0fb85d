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


class BatchProbeGate:
    """Batch-level draft skipping on top of probe_due.

    Per-request probes keep their own phases, so under sustained load a batch of R requests pays up to R separate
    draft passes per probe period. When `quiet_after` probe steps in a row verified nothing for anybody, it is the
    load, not one request's drafts, that keeps l = 0: per-request probing stops and the whole batch is drafted
    together on one step, `first` steps later, doubling up to `max_gap`. Any verified draft reopens per-request
    probing. Requests that arrive meanwhile wait for the next batch probe, at most `max_gap` steps.
    """

    def __init__(self, quiet_after: int = 2, first: int = PROBE_FIRST, max_gap: int = PROBE_MAX_GAP):
        self.quiet_after, self.first, self.max_gap = quiet_after, first, max_gap
        self.quiet = 0  # consecutive probe steps (something drafted) with nothing verified anywhere
        self.next_step = 0

    @property
    def batch_mode(self) -> bool:
        return self.quiet >= self.quiet_after

    def active(self, streak: torch.Tensor, step: int) -> torch.Tensor:
        """Bool[R]: draft for this request on this step."""
        if not self.batch_mode:
            return probe_due(streak)
        return torch.full(streak.shape, step >= self.next_step, dtype=torch.bool)

    def observe(self, step: int, drafted: int, verified: int) -> None:
        if drafted == 0:
            return
        if verified > 0:
            self.quiet = 0
            return
        self.quiet += 1
        if self.batch_mode:
            self.next_step = step + min(self.first << (self.quiet - self.quiet_after), self.max_gap)


def draft_mask(num_requests: int, *, probe: torch.Tensor | None = None, chain_worthier: torch.Tensor | None = None,
               no_speculation: torch.Tensor | None = None, grammar_copied: torch.Tensor | None = None) -> torch.Tensor:
    """Bool[R]: the requests the draft pass runs for. Every reason to leave a request out holds on its own: a probe
    step (`probe`, True = drafted) does not bring back a request whose retrieval chain is worth at least the
    drafter's block (`chain_worthier`), nor one that asked for no speculation or whose grammar drafts for it."""
    active = torch.ones(num_requests, dtype=torch.bool)
    if probe is not None:
        active &= probe
    for leave_out in (chain_worthier, no_speculation, grammar_copied):
        if leave_out is not None:
            active &= ~leave_out
    return active
