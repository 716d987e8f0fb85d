"""Chain-only verify attention vs SGLang's torch_native EXTEND path, on the CPU, per 24-layer forward.

    python benchmarks/cpu_verify_attention.py [--threads 2] [--out benchmarks/results/cpu_verify_attention.json]

Shapes of the embedded target (Qwen2.5-Coder-0.5B: 14 query heads, 2 KV heads, head_dim 64, 24 layers), bf16,
KV lengths ~150-210 tokens per request, chains of 2 and 8 tokens, batch 1 / 4 / 16. Both paths read the same
paged cache; the outputs are checked equal before timing.
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
from dspark_kernels.cpu_verify_attention import chain_attention_sdpa  # noqa: E402

H, HKV, HD, LAYERS = 14, 2, 64, 24


def case(batch: int, chain: int, dtype=torch.bfloat16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    kv_lens = [150 + (37 * i) % 60 for i in range(batch)]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/cpu_verify_attention.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    sglang_path = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)._run_sdpa_forward_extend  # stateless method
    rows = []
    for batch in (1, 4, 16):
        for chain in (2, 8):
            q, k, v, r2t, rows_idx, lens, ext = case(batch, chain)
            out_ours, out_theirs = torch.empty_like(q), torch.empty_like(q)

            def ours():
                chain_attention_sdpa(q, out_ours, k, v, r2t, rows_idx, lens, ext, scale=HD ** -0.5)

            def theirs():
                sglang_path(q, out_theirs, k, v, r2t, rows_idx, lens, lens - ext, ext, None, scaling=HD ** -0.5,
                            enable_gqa=True, causal=True)

            ours()
            theirs()
            err = float((out_ours.float() - out_theirs.float()).abs().max())
            t_ours, t_theirs = time_layers(ours, args.repeats), time_layers(theirs, args.repeats)
            row = {"batch": batch, "chain": chain, "sglang_torch_native_ms": round(1e3 * t_theirs, 2),
                   "chain_only_ms": round(1e3 * t_ours, 2), "speedup": round(t_theirs / t_ours, 1),
                   "max_abs_diff": err}
            rows.append(row)
            print(row, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"threads": args.threads, "layers": LAYERS, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
