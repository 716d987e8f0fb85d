"""bf16 vs fp32 vs our small-M kernel: GEMM cost by row count on this CPU. Does batching (or verifying a chain)
come nearly free?

    python benchmarks/cpu_gemm_dtype.py [--threads 2] [--out benchmarks/results/cpu_gemm_dtype.json]

Shapes of the embedded target (Qwen2.5-Coder-0.5B): the fused gate/up projection 896 -> 9728, the down projection
4864 -> 896 and the 151,936-row lm_head, at 1 to 64 rows (one decode step of that many requests, or a verify chain of
that many tokens). On a CPU with native bf16 dot products (AVX512-BF16, AMX) bf16 rows are cheap until the weights
stop being the bottleneck; without them torch's bf16 costs grow with the rows. "bf16-kernel" is
dspark_kernels/cpu_bf16_gemm.small_m_linear (bf16 weights read once for all rows; torch's bf16 where it cannot be built).
Prints the CPU's model and vector ISA with the table; writes the JSON and a PNG next to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's dspark_kernels/ package, not benchmarks/kernels.py

SHAPES = {"gate_up": (9728, 896), "down": (896, 4864), "lm_head": (151936, 896)}
ROWS = (1, 2, 4, 8, 16, 32, 64)
KINDS = ("bf16", "float32", "bf16-kernel")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", default="benchmarks/results/cpu_gemm_dtype.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from dspark_kernels.cpu_bf16_gemm import load, small_m_linear
    from sglang_dspark.bench.draft_cost import median_time
    from sglang_dspark.sglang_plugin.cost_profile import cpu_identity

    kernel_fn, why_not = load()
    if kernel_fn is None:
        print(f"small-M kernel unavailable ({why_not}): its rows time torch's bf16 GEMM")

    rows = []
    for name, (n, k) in SHAPES.items():
        w32 = torch.randn(n, k)
        repeats = args.repeats if n < 100_000 else max(3, args.repeats // 3)  # the lm_head takes up to 0.4 s
        for kind in KINDS:
            dtype = torch.float32 if kind == "float32" else torch.bfloat16
            w = w32.to(dtype)
            linear = small_m_linear if kind == "bf16-kernel" else F.linear
            base = None
            for m in ROWS:
                x = torch.randn(m, k).to(dtype)
                ms = 1e3 * median_time(lambda: linear(x, w), repeats)
                base = base or ms
                rows.append(dict(shape=name, dtype=kind, rows=m, ms=round(ms, 3), vs_one_row=round(ms / base, 2)))
                print(f"{name:8s} {rows[-1]['dtype']:9s} rows {m:3d}: {ms:8.3f} ms ({ms / base:5.2f}x one row)",
                      flush=True)
    result = {"cpu": cpu_identity(), "threads": args.threads, "torch": torch.__version__,
              "kernel": "built" if kernel_fn is not None else f"unavailable: {why_not}", "rows": rows}
    print(result["cpu"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    _plot(result, Path(args.out).with_suffix(".png"))
    print(f"wrote {args.out} and its PNG")


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SHAPES), figsize=(4.2 * len(SHAPES), 3.6))
    for ax, (name, (n, k)) in zip(axes, SHAPES.items()):
        for kind in KINDS:
            pts = [(r["rows"], r["ms"]) for r in result["rows"] if r["shape"] == name and r["dtype"] == kind]
            ax.plot(*zip(*pts), marker="o", label=kind)
        ax.set(title=f"{name} {n} x {k}", xlabel="rows (requests or verify tokens)", ylabel="ms", xscale="log",
               yscale="log")
        ax.set_xticks(ROWS, [str(r) for r in ROWS])
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"GEMM time by row count, {result['cpu']}, {result['threads']} threads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
