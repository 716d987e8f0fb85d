"""bf16 vs fp32 GEMM cost by row count on this CPU: does batching (or verifying a chain) come nearly free?

    python benchmarks/cpu_gemm_dtype.py [--threads 2] [--out benchmarks/results/cpu_gemm_dtype.json]

Shapes of the embedded target (Qwen2.5-Coder-0.5B): the MLP up projection 896 -> 4864 and the 151,936-row lm_head,
at 1 / 8 / 32 rows (one decode step of 1 / 8 / 32 requests, or a verify chain of that many tokens). On a CPU with
native bf16 dot products (AVX512-BF16, AMX) bf16 rows are cheap until the weights stop being the bottleneck; without
them, bf16 costs grow with the rows while fp32's barely do. Prints the CPU's model and vector ISA with the table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {"mlp_up": (4864, 896), "lm_head": (151936, 896)}
ROWS = (1, 8, 32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", default="benchmarks/results/cpu_gemm_dtype.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from sglang_dspark.bench.draft_cost import median_time
    from sglang_dspark.sglang_plugin.cost_profile import cpu_identity

    rows = []
    for name, (n, k) in SHAPES.items():
        w32 = torch.randn(n, k)
        repeats = args.repeats if n < 100_000 else max(3, args.repeats // 3)  # the lm_head takes up to 0.4 s
        for dtype in (torch.bfloat16, torch.float32):
            w = w32.to(dtype)
            base = None
            for m in ROWS:
                x = torch.randn(m, k).to(dtype)
                ms = 1e3 * median_time(lambda: F.linear(x, w), repeats)
                base = base or ms
                rows.append(dict(shape=name, dtype=str(dtype).removeprefix("torch."), rows=m, ms=round(ms, 3),
                                 vs_one_row=round(ms / base, 2)))
                print(f"{name:8s} {rows[-1]['dtype']:9s} rows {m:3d}: {ms:8.3f} ms ({ms / base:5.2f}x one row)",
                      flush=True)
    result = {"cpu": cpu_identity(), "threads": args.threads, "torch": torch.__version__, "rows": rows}
    print(result["cpu"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
