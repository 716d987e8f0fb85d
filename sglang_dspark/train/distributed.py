"""Data parallelism for `train fit` under torchrun: gloo on CPU, NCCL on GPU.

Every rank builds the whole optimizer step's sequence list (data order and anchors are pure functions of the seed
and the micro-step index) and so knows the step's global loss denominator without communicating. Rank r runs the
forward and backward of sequences r, r + W, r + 2W, ...; the gradients are then summed, not averaged, because each
loss is already divided by the global weight sum. One process and W processes at the same global batch thus take the
same optimizer steps, up to the order of floating-point sums.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mine(self, i: int) -> bool:
        """Does this rank run micro-sequence i of a step?"""
        return i % self.size == self.rank


def init_world(device_type: str) -> World:
    """Join the torchrun group when WORLD_SIZE > 1 (idempotent); a single process gets World(0, 1)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    return World(dist.get_rank(), dist.get_world_size())


def local_device(world: World, requested: str | None) -> torch.device:
    if requested:
        return torch.device(requested)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", world.rank)) % torch.cuda.device_count())
    return torch.device("cpu")


def sum_gradients(params: list[torch.nn.Parameter], world: World) -> None:
    """All-reduce (sum) every gradient in one flat buffer; parameters a rank did not touch contribute zeros."""
    if world.size == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset: offset + n].view_as(p).clone()
        offset += n


def sum_stats(stats: dict[str, float], world: World, device: torch.device) -> dict[str, float]:
    if world.size == 1 or not stats:
        return stats
    keys = sorted(stats)
    t = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def agree_any(flag: bool, world: World) -> bool:
    """True on every rank when it is true on any (each rank's own clock must not split the loop)."""
    if world.size == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64,
                     device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier(world: World) -> None:
    if world.size > 1:
        dist.barrier()


def shutdown(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
