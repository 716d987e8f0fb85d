"""Time one greedy draft pass of a drafter as the worker calls it (batch R over a 300-token context of random K/V,
the inputs of `bench draft_cost`), and with --prof list its operators by self time and input shape. Unlike
`bench draft_cost` it needs no target forward and writes nothing, so it can time any drafter copy.

    python benchmarks/draft_pass_profile.py --batch 1 [--prof] [--drafter DIR] [--dtype float32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's dspark_kernels/ package, not benchmarks/kernels.py

from sglang_dspark.bench.draft_cost import draft_inputs, median_time
from sglang_dspark.drafter.checkpoint import load_drafter
from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR
from sglang_dspark.train.target import load_target_shared_weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=300)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--drafter", default=str(DEFAULT_DRAFTER_DIR))
    p.add_argument("--prof", action="store_true")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="float32: as the server ran it with torch-bf16 as the --dspark-cpu-gemm narrow side")
    p.add_argument("--kernel", action="store_true",
                   help="bf16 drafter with its GEMMs on the small-M kernel plan (cpu_gemm.route_drafter), as the "
                        "server runs it where the kernel builds")
    args = p.parse_args()
    embed, lm_head = load_target_shared_weights(str(DEFAULT_TARGET_DIR))
    dtype = getattr(torch, args.dtype)
    drafter = load_drafter(args.drafter, target_embed=embed, target_lm_head=lm_head, dtype=dtype).eval()
    if args.kernel:
        from sglang_dspark.sglang_plugin.cpu_gemm import route_drafter

        print("drafter gemm:", route_drafter(drafter))
    inputs = draft_inputs(drafter.config, args.batch, args.context, dtype)
    seconds = median_time(lambda: drafter.propose(*inputs), args.repeats)
    print(f"batch {args.batch}: median {1000 * seconds:.2f} ms over {args.repeats} passes")
    if args.prof:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(10):
                drafter.propose(*inputs)
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
