"""One decode step's GEMMs, weights streamed from memory: torch's bf16 GEMM vs our small-M kernels by row count.

    python benchmarks/cpu_gemm_dp.py [--threads 2] [--out benchmarks/results/cpu-gemm-dp-<date>.json]

Every linear layer of the embedded target (24 layers x qkv / o / gate_up / down, distinct weights, ~0.7 GB bf16)
and its 151,936-row lm_head, run once per "step" at 1-16 rows: what a plain decode step of that many requests, or
a verify pass of that many tokens, spends in GEMMs. Unlike a microbenchmark of one weight (benchmarks/
cpu_gemm_dtype.py), nothing fits in the caches, as in serving. Kinds: torch (F.linear, bf16), avx2 (the AVX2
kernel on fp32-upcast inputs), dp (the AVX512-BF16 kernel on bf16 inputs), amx (the AMX kernel; all these shapes
fit its tiles); a kernel that does not build here is left out. Kinds are interleaved per repeat so that drift on a shared machine hits them alike. JSON + PNG.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's dspark_kernels/ package

LAYER_SHAPES = ((1152, 896), (896, 896), (9728, 896), (896, 4864))  # qkv, o, gate_up, down: (out, in)
LM_HEAD = (151936, 896)
ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=f"benchmarks/results/cpu-gemm-dp-{datetime.date.today()}.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from dspark_kernels import cpu_bf16_gemm
    from sglang_dspark.sglang_plugin.cost_profile import cpu_identity

    kinds = {"torch": (F.linear, torch.bfloat16)}
    amx = cpu_bf16_gemm.load_amx()

    def dp_only(x, w):  # the AVX512-BF16 kernel even where the AMX one would take the shape
        cpu_bf16_gemm._loaded_amx = (None, "dp kind")
        try:
            return cpu_bf16_gemm.small_m_linear(x, w)
        finally:
            cpu_bf16_gemm._loaded_amx = amx

    for name, loader, linear, dtype in (("avx2", cpu_bf16_gemm.load, cpu_bf16_gemm.small_m_linear, torch.float32),
                                        ("dp", cpu_bf16_gemm.load_dp, dp_only, torch.bfloat16),
                                        ("amx", cpu_bf16_gemm.load_amx, cpu_bf16_gemm.small_m_linear,
                                         torch.bfloat16)):
        fn, why = loader()
        if fn is None:
            print(f"{name} kernel unavailable here: {why}")
        else:
            kinds[name] = (linear, dtype)  # the input dtype picks the kernel
    g = torch.Generator().manual_seed(0)
    layers = [[torch.randn(o, i, generator=g).bfloat16() for o, i in LAYER_SHAPES] for _ in range(args.layers)]
    head = torch.randn(*LM_HEAD, generator=g).bfloat16()
    weights = [w for ws in layers for w in ws] + [head]

    def step(linear, dtype, m):
        xs = {k: torch.randn(m, k).to(dtype) for k in (896, 4864)}
        for w in weights:
            linear(xs[w.shape[1]], w)

    times = {(k, m): [] for k in kinds for m in ROWS}
    for m in tqdm(ROWS, desc="rows"):
        for k, (linear, dtype) in kinds.items():
            step(linear, dtype, m)  # warm-up
        for _ in range(args.repeats):
            for k, (linear, dtype) in kinds.items():
                t0 = time.perf_counter()
                step(linear, dtype, m)
                times[(k, m)].append(1e3 * (time.perf_counter() - t0))
    rows = []
    for m in ROWS:
        base = statistics.median(times[("torch", m)])
        for k in kinds:
            ms = statistics.median(times[(k, m)])
            one = statistics.median(times[(k, 1)])
            rows.append(dict(kind=k, rows=m, ms=round(ms, 2), vs_torch=round(ms / base, 3),
                             vs_one_row=round(ms / one, 3)))
        print(f"rows {m:2d}: " + "  ".join(f"{r['kind']} {r['ms']:7.1f} ms ({r['vs_torch']:.2f}x torch)"
                                          for r in rows[-len(kinds):]), flush=True)
    result = {"date": str(datetime.date.today()), "cpu": cpu_identity(), "threads": args.threads,
              "torch": torch.__version__, "layers": args.layers, "repeats": args.repeats,
              "weights_gib": round(sum(w.numel() * 2 for w in weights) / 2**30, 3), "rows": rows}
    print(result["cpu"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    _plot(result, Path(args.out).with_suffix(".png"), list(kinds))
    print(f"wrote {args.out} and its PNG")


def _plot(result: dict, path: Path, kinds: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for k in kinds:
        pts = [(r["rows"], r["ms"]) for r in result["rows"] if r["kind"] == k]
        ax.plot(*zip(*pts), marker="o", label=k)
    ax.set(xlabel="rows (requests in a decode step, or tokens in a verify pass)", ylabel="ms per step (GEMMs)",
           title=f"One step's GEMMs, {result['weights_gib']} GiB of bf16 weights", ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle(f"{result['cpu']}, {result['threads']} threads, {result['date']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
