"""Cost of drawing one token per request at T > 0: SGLang's CPU sampler vs the worker's plain-decode sampler.

    python benchmarks/plain_sampling.py [--threads 2] [--out benchmarks/results/plain_sampling.json]

SGLang's side is its own code, imported: softmax at the request temperature, then `sampling_from_probs_torch`
(torch.multinomial) when nothing is cut, or `top_k_top_p_min_p_sampling_from_probs_torch` with top-k / top-p; this
is what its Sampler runs on a CPU. Ours is sglang_plugin/target_sampling.sample_plain (the target's support, then
two-level inverse-CDF sampling). V = 151,936 (the embedded target), batches 1 / 4 / 16 / 32, logits random with a
few peaked tokens per row. Both are checked to draw the same law on a small vocabulary in
tests/unit/test_target_sampling.py; this script only times them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_dspark.bench.draft_cost import median_time  # noqa: E402
from sglang_dspark.bench.report import markdown_table, update_section  # noqa: E402
from sglang_dspark.sglang_plugin.target_sampling import sample_plain  # noqa: E402

V = 151_936
TOP_K_ALL = 1 << 30
SETTINGS = {"T 1, nothing cut (the embedded model's T = 1 requests)": (1.0, TOP_K_ALL, 1.0),
            "T 0.7, top-k 20, top-p 0.8": (0.7, 20, 0.8)}


def lm_like_logits(batch: int, gen: torch.Generator) -> torch.Tensor:
    logits = torch.randn(batch, V, generator=gen) * 2
    peaks = torch.randint(V, (batch, 8), generator=gen)
    logits.scatter_(1, peaks, 12 + 2 * torch.rand(batch, 8, generator=gen))
    return logits


def sglang_sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    from sglang.srt.layers.sampler import sampling_from_probs_torch, top_k_top_p_min_p_sampling_from_probs_torch

    B = logits.shape[0]
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_k >= V and top_p >= 1.0:
        return sampling_from_probs_torch(probs)
    # max_top_k as SamplingBatchInfo sets it when every request has a top-k (its fast topk path instead of a sort)
    out = top_k_top_p_min_p_sampling_from_probs_torch(probs, torch.full((B,), top_k), torch.full((B,), top_p),
                                                      torch.zeros(B), False, None, None, max_top_k=top_k)
    return out[0] if isinstance(out, tuple) else out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default="benchmarks/results/plain_sampling.json")
    p.add_argument("--no-markdown", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    cases = [(name, b) for name in SETTINGS for b in (1, 4, 16, 32)]
    for name, batch in tqdm(cases, desc="plain sampling"):
        temperature, top_k, top_p = SETTINGS[name]
        logits = lm_like_logits(batch, gen)
        si = SimpleNamespace(temperatures=torch.full((batch, 1), temperature), top_ks=torch.full((batch,), top_k),
                             top_ps=torch.full((batch,), top_p), min_ps=torch.zeros(batch), need_min_p_sampling=False,
                             acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None)
        theirs = median_time(lambda: sglang_sample(logits, temperature, top_k, top_p), args.repeats)
        ours = median_time(lambda: sample_plain(logits, si), args.repeats)
        rows.append({"sampling": name, "batch": batch, "sglang_ms": round(1e3 * theirs, 2),
                     "ours_ms": round(1e3 * ours, 2), "speedup": f"{theirs / ours:.1f}x"})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"threads": args.threads, "vocab": V, "rows": rows}, indent=2) + "\n")
    table = markdown_table(rows, ["sampling", "batch", "sglang_ms", "ours_ms", "speedup"])
    print(table)
    if not args.no_markdown:
        update_section("plain_sampling", table)


if __name__ == "__main__":
    main()
