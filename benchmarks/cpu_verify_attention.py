"""Chain-only verify attention vs SGLang's torch_native EXTEND path, on the CPU, per 24-layer forward.

    python benchmarks/cpu_verify_attention.py [--threads 2] [--kv 150 600] [--out benchmarks/results/<name>.json]

Shapes of the embedded target (Qwen2.5-Coder-0.5B: 14 query heads, 2 KV heads, head_dim 64, 24 layers), bf16,
KV lengths of --kv to --kv + 60 tokens per request, chains of 2, 4 and 8 tokens, batch 1 / 4 / 16. Three paths read
the same paged cache: SGLang's, ours as served, and ours with one SDPA per chain (the path reduced-precision chains
took before the fp32 products, MAX_FP32_ROWS = 1); their outputs are compared before timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo's dspark_kernels/ package, not benchmarks/kernels.py
import dspark_kernels.cpu_verify_attention as cva  # noqa: E402
from dspark_kernels.cpu_verify_attention import chain_attention_sdpa  # noqa: E402
from sglang_dspark.bench.machine import describe_machine  # noqa: E402

H, HKV, HD, LAYERS = 14, 2, 64, 24


def case(batch: int, chain: int, kv: int = 150, dtype=torch.bfloat16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    kv_lens = [kv + (37 * i) % 60 for i in range(batch)]
    slots = torch.randperm(sum(kv_lens) + 8, generator=g)
    r2t = torch.zeros(batch, max(kv_lens), dtype=torch.int64)
    used = 0
    for r, L in enumerate(kv_lens):
        r2t[r, :L] = slots[used:used + L]
        used += L
    k = torch.randn(len(slots), HKV, HD, generator=g).to(dtype)
    v = torch.randn(len(slots), HKV, HD, generator=g).to(dtype)
    q = torch.randn(batch * chain, H, HD, generator=g).to(dtype)
    lens = torch.tensor(kv_lens)
    ext = torch.full((batch,), chain)
    return q, k, v, r2t, torch.arange(batch), lens, ext


def time_layers(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(LAYERS):
            fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_interleaved(fns, repeats: int) -> list[float]:
    """Median 24-layer time of each fn, timed in alternating order so drift on a shared 2-core VM hits all alike
    (timed one after the other, the same two paths read 0.78-1.6x of each other from run to run)."""
    times = [[] for _ in fns]
    for r in range(repeats):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            times[i].append(time_layers(fns[i], 1))
    return [statistics.median(t) for t in times]


def plot(rows: list[dict], path: Path, machine: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"kv {r['kv']}\nB{r['batch']} n{r['chain']}" for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(rows)), 4))
    ax.bar([i - 0.2 for i in x], [r["chain_sdpa_ms"] for r in rows], 0.4, label="one SDPA per chain")
    ax.bar([i + 0.2 for i in x], [r["chain_only_ms"] for r in rows], 0.4, label="served (fp32 products)")
    ax.set_xticks(list(x), labels, fontsize=6)
    ax.set_ylabel("attention ms per 24-layer verify forward")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"chain-verify attention, bf16; {machine}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--kv", type=int, nargs="+", default=[150])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    sglang_path = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)._run_sdpa_forward_extend  # stateless method
    rows = []
    for kv in args.kv:
        for batch in (1, 4, 16):
            for chain in (2, 4, 8):
                q, k, v, r2t, rows_idx, lens, ext = case(batch, chain, kv)
                outs = {name: torch.empty_like(q) for name in ("ours", "sdpa", "theirs")}

                def ours(out=outs["ours"]):
                    chain_attention_sdpa(q, out, k, v, r2t, rows_idx, lens, ext, scale=HD ** -0.5)

                def sdpa_per_chain(out=outs["sdpa"]):
                    kept, cva.MAX_FP32_ROWS = cva.MAX_FP32_ROWS, 1
                    try:
                        chain_attention_sdpa(q, out, k, v, r2t, rows_idx, lens, ext, scale=HD ** -0.5)
                    finally:
                        cva.MAX_FP32_ROWS = kept

                def theirs(out=outs["theirs"]):
                    sglang_path(q, out, k, v, r2t, rows_idx, lens, lens - ext, ext, None, scaling=HD ** -0.5,
                                enable_gqa=True, causal=True)

                for fn in (ours, sdpa_per_chain, theirs):
                    fn()
                err = float((outs["ours"].float() - outs["theirs"].float()).abs().max())
                t_ours, t_sdpa = time_interleaved((ours, sdpa_per_chain), args.repeats)
                t_theirs = time_layers(theirs, 3)
                row = {"kv": kv, "batch": batch, "chain": chain, "sglang_torch_native_ms": round(1e3 * t_theirs, 2),
                       "chain_sdpa_ms": round(1e3 * t_sdpa, 2), "chain_only_ms": round(1e3 * t_ours, 2),
                       "speedup": round(t_theirs / t_ours, 1), "vs_chain_sdpa": round(t_sdpa / t_ours, 2),
                       "max_abs_diff": err}
                rows.append(row)
                print(row, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    plot(rows, Path(args.out).with_suffix(".png"), describe_machine())
    Path(args.out).write_text(json.dumps({"command": "python " + " ".join(sys.argv), "machine": describe_machine(),
                                          "threads": args.threads, "layers": LAYERS, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
