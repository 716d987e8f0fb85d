"""Tensor parallelism: every TP rank runs the worker, and rank 0 decides.

The verify lengths come from wall-clock cost models, gates and calibrated confidences whose inputs differ per rank
(each rank times its own forward). If two ranks chose different lengths, their verify forwards would differ in
shape and the next collective would hang. So at each decision point the worker broadcasts rank 0's values from the
TP group's first rank over its CPU (gloo) group, and every rank adopts them:

  plan    whether the step is a plain decode step, the drafts and the final verify lengths (after every policy
          and gate), and the drafter-failure code;
  accept  the accept lengths, the committed tokens and the bonus tokens;
  plain   the sampled tokens of a plain decode step that samples itself.

The other ranks' policies still run (cheap), but their choices are overwritten, and their cost models, gates and
calibration are never fed: only rank 0's learn, from rank 0's clock. `SGLANG_DSPARK_TP_SYNC=0` turns the broadcasts off, for debugging only: ranks
can then diverge and hang.
"""

from __future__ import annotations

import os

import torch

ENV = "SGLANG_DSPARK_TP_SYNC"


class RankSync:
    """Broadcast of small int64 tensors from the group's first rank. A one-rank (or disabled) sync is a no-op."""

    def __init__(self, group=None, rank: int = 0, world_size: int = 1, src: int = 0, enabled: bool = True) -> None:
        self.group, self.rank, self.world_size, self.src = group, rank, world_size, src
        self.enabled = enabled and world_size > 1

    @classmethod
    def from_sglang(cls, tp_size: int) -> "RankSync":
        if tp_size <= 1:
            return cls()
        from sglang.srt.layers.dp_attention import get_dp_tp_group

        g = get_dp_tp_group()
        return cls(g.cpu_group, g.rank_in_group, g.world_size, g.first_rank,
                   enabled=os.environ.get(ENV, "1") != "0")

    @property
    def authoritative(self) -> bool:
        """Rank 0 of the group: its decisions win, and it alone writes files (cost models, traces)."""
        return self.rank == 0

    def ints(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Rank 0's values of `tensors` (any int / bool dtype, same shapes on every rank), on their devices."""
        if not self.enabled:
            return tensors
        flat = torch.cat([t.detach().to("cpu", torch.int64).reshape(-1) for t in tensors])
        torch.distributed.broadcast(flat, src=self.src, group=self.group)
        out, offset = [], 0
        for t in tensors:
            n = t.numel()
            out.append(flat[offset: offset + n].view(t.shape).to(device=t.device, dtype=t.dtype))
            offset += n
        return tuple(out)

    def flag(self, value: bool) -> bool:
        if not self.enabled:
            return value
        return bool(self.ints(torch.tensor([int(value)]))[0][0])
