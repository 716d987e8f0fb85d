"""Micro-benchmark of controller cost: `python -m sglang_dspark.control.bench_cost [--requests 256 --gamma 7]`."""

import argparse
import statistics
import time

import torch

from .base import BatchContext
from .cost_model import EngineCostModel
from .factory import make_policy


def time_policy(spec: str, requests: int, gamma: int, iters: int, seed: int = 0) -> float:
    """Median milliseconds of one choose() call on random confidences."""
    gen = torch.Generator().manual_seed(seed)
    # A plausible GPU-ish curve: 12 ms base, 20 us/token, 10 us/request, 2 ns/KV token, CUDA-graph staircase.
    cost = EngineCostModel(coef=(0.012, 2e-5, 1e-5, 2e-9), bucket_edges=[256, 512, 1024, 2048])
    cost.bucket_offsets = [0.0, 0.001, 0.002, 0.004, 0.008]
    policy = make_policy(spec, cost, gamma=gamma)
    confs = [torch.rand(requests, gamma, generator=gen) ** 0.3 for _ in range(8)]
    ctx = BatchContext(num_requests=requests, kv_lens=torch.full((requests,), 2048, dtype=torch.long))
    times = []
    for i in range(iters):
        start = time.perf_counter()
        policy.choose(confs[i % len(confs)], ctx)
        times.append(time.perf_counter() - start)
    return statistics.median(times[len(times) // 10 :]) * 1e3  # drop warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--gamma", type=int, default=7)
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    parser.add_argument("--policies", default="dspark,dspark-async,sps-topk,threshold:0.6,fixed:7")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, R={args.requests}, G={args.gamma}")
    for spec in args.policies.split(","):
        print(f"{spec:>14}: median {time_policy(spec, args.requests, args.gamma, args.iters):.3f} ms / choose()")


if __name__ == "__main__":
    main()
