"""Tensor parallelism: two gloo ranks whose confidences and timings differ still take rank 0's decisions, and the
broadcasts do not hang."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_dspark.bench.server import free_port
from sglang_dspark.control import BatchContext, EngineCostModel, make_policy
from sglang_dspark.sglang_plugin.rank_sync import RankSync

STEPS, R, G = 40, 6, 7


def _rank(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=__import__("datetime").timedelta(seconds=60))
    sync = RankSync(dist.group.WORLD, rank, 2, src=0)
    cost = EngineCostModel(coef=(0.02, 0.002, 0.001, 1e-6))
    policy = make_policy("dspark", cost, gamma=G)
    g = torch.Generator().manual_seed(0)  # same stream on both ranks ...
    noise = torch.Generator().manual_seed(100 + rank)  # ... plus each rank's own perturbation
    local, agreed = [], []
    for step in range(STEPS):
        conf = torch.rand(R, G, generator=g)
        timing = 0.05 + 0.05 * torch.rand(1, generator=g).item()
        if rank == 1:
            conf = (conf + 0.3 * torch.randn(R, G, generator=noise)).clamp(0.01, 0.99)
            timing *= 1.5 + torch.rand(1, generator=noise).item()
        kv = torch.full((R,), 300 + 10 * step, dtype=torch.int64)
        ctx = BatchContext(num_requests=R, kv_lens=kv, last_step_time_s=timing, step_index=step)
        lens = policy.choose(conf, ctx).to(torch.int64).clamp(0, G)
        drafts = torch.randint(0, 1000, (R, G), generator=noise)
        plain = sync.flag(bool(lens.sum() == 0))
        lens2, drafts2 = sync.ints(lens, drafts)
        cost.update(int(R + lens2.sum()), R, int(kv.sum()), timing)  # each rank still refines its own model
        local.append(lens)
        agreed.append((plain, lens2, drafts2))
    torch.save({"local": local, "agreed": agreed}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_perturbed_ranks_agree_on_rank0s_verify_lengths(tmp_path):
    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"rank{i}.pt") for i in (0, 1))
    assert any(not torch.equal(a, b) for a, b in zip(r0["local"], r1["local"])), "the perturbation changed nothing"
    for step, ((p0, l0, d0), (p1, l1, d1)) in enumerate(zip(r0["agreed"], r1["agreed"])):
        assert p0 == p1 and torch.equal(l0, l1) and torch.equal(d0, d1), step
        assert torch.equal(l0, r0["local"][step])  # what everyone adopts is rank 0's own choice


def test_one_rank_or_switched_off_is_a_no_op():
    t = torch.arange(5)
    assert RankSync().ints(t)[0] is t and RankSync().flag(True)
    assert not RankSync(world_size=2, rank=1, enabled=False).enabled
