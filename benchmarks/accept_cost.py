"""Cost of T > 0 acceptance per verify step: the dense rule vs the packed support-only rule (verify/support.py).

    python benchmarks/accept_cost.py [--threads 2] [--out benchmarks/results/accept_cost.json]

Sizes of the embedded target: V = 151,936, the shipped drafter's 32,768-token draft vocabulary, gamma = 7. Cases:
batch 1 / 4 / 16 with 1 verified draft in the batch or 1 per request, for three sampling settings: Qwen's
recommended chat settings (temperature 0.7, top-k 20, top-p 0.8), top-p 0.95 without top-k, and plain T = 1 (nothing
cut: what a T = 1 request to the embedded model gets, its generation_config sets no top-k / top-p). Logits are random with a few peaked tokens per row, like an LM's. Both rules get the same
uniforms and are checked to accept the same drafts before timing.

Second table: the drafter's T > 0 sampling, gamma positions of R rows over its 32,768-token vocabulary, with
torch.multinomial vs sglang_dspark/sampling.py's inverse-CDF sample_rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_dspark.bench.draft_cost import median_time  # noqa: E402
from sglang_dspark.sampling import sample_rows  # noqa: E402
from sglang_dspark.verify import accept_rejection  # noqa: E402
from sglang_dspark.verify.support import DraftDistribution, accept_rejection_packed, target_support  # noqa: E402
from sglang_dspark.verify.target_dist import target_probs  # noqa: E402

V, VD, GAMMA = 151_936, 32_768, 7
TOP_K_ALL = 1 << 30
SETTINGS = {
    "T 0.7, top-k 20, top-p 0.8 (Qwen chat settings)": (0.7, 20, 0.8),
    "top-p 0.95, no top-k": (1.0, TOP_K_ALL, 0.95),
    "T 1, nothing cut": (1.0, TOP_K_ALL, 1.0),
}


def case(batch: int, per_request: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.ones(batch, dtype=torch.int64) if per_request else torch.zeros(batch, dtype=torch.int64)
    lens[0] = 1
    n = int((lens + 1).sum())
    logits = torch.randn(n, V, generator=g) * 2
    logits.scatter_add_(1, torch.randint(0, V, (n, 5), generator=g), torch.full((n, 5), 10.0))
    vocab = torch.randperm(V, generator=g)[:VD].sort().values
    draft_logits = torch.randn(batch, GAMMA, VD, generator=g) * 2
    drafts = vocab[torch.randint(0, VD, (batch, GAMMA), generator=g)]
    return lens, logits, vocab, draft_logits, drafts, torch.rand(batch, GAMMA, generator=g)


def dense_rule(lens, logits, vocab, draft_logits, drafts, u, temp, top_k, top_p):
    batch = lens.numel()
    n = logits.shape[0]
    p_rows = target_probs(logits, torch.full((n,), temp), torch.full((n,), top_k), torch.full((n,), top_p))
    take = torch.arange(GAMMA + 1).view(1, -1) < (lens + 1).view(-1, 1)
    p = torch.zeros(batch, GAMMA + 1, V)
    p[take] = p_rows
    dense = torch.full((batch, GAMMA, V), float("-inf"))
    dense[..., vocab] = draft_logits
    q = torch.softmax(dense / temp, -1)
    return accept_rejection(drafts, q, p, lens, uniforms=u)


def packed_rule(lens, logits, vocab, draft_logits, drafts, u, temp, top_k, top_p):
    batch, n = lens.numel(), logits.shape[0]
    support = target_support(logits, torch.full((n,), temp), torch.full((n,), top_k), torch.full((n,), top_p))
    draft = DraftDistribution(draft_logits, torch.full((batch,), temp), torch.arange(batch), vocab)
    return accept_rejection_packed(drafts, lens, support, draft, uniforms=u)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/accept_cost.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    grid = [(s, b, per) for s in SETTINGS for b in (1, 4, 16) for per in (False, True) if not (b == 1 and per)]
    rows = []
    for name, batch, per_request in tqdm(grid, desc="accept cost"):
        temp, top_k, top_p = SETTINGS[name]
        inputs = case(batch, per_request)
        a = dense_rule(*inputs, temp, top_k, top_p)
        b = packed_rule(*inputs, temp, top_k, top_p)
        if not torch.equal(a.accept_lens, b.accept_lens):
            raise SystemExit(f"accept decisions differ in case {name} batch {batch}")
        dense_ms = 1e3 * median_time(lambda: dense_rule(*inputs, temp, top_k, top_p), args.repeats)
        packed_ms = 1e3 * median_time(lambda: packed_rule(*inputs, temp, top_k, top_p), args.repeats)
        rows.append(dict(sampling=name, batch=batch, verified_drafts=int(inputs[0].sum()), dense_ms=round(dense_ms, 2),
                         packed_ms=round(packed_ms, 2), speedup=round(dense_ms / packed_ms, 1)))
    print("| sampling | batch | verified drafts | dense rule (ms) | packed rule (ms) | speedup |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['sampling']} | {r['batch']} | {r['verified_drafts']} | {r['dense_ms']} | {r['packed_ms']} | "
              f"{r['speedup']}x |")
    sampling = []
    for batch in (1, 4, 16):
        probs = torch.softmax(torch.randn(batch, VD, generator=torch.Generator().manual_seed(batch)) * 2, -1)
        multinomial_ms = 1e3 * median_time(lambda: [torch.multinomial(probs, 1) for _ in range(GAMMA)], args.repeats)
        cdf_ms = 1e3 * median_time(lambda: [sample_rows(probs) for _ in range(GAMMA)], args.repeats)
        sampling.append(dict(batch=batch, multinomial_ms=round(multinomial_ms, 2), inverse_cdf_ms=round(cdf_ms, 2)))
    print("\n| draft sampling, batch | torch.multinomial x gamma (ms) | inverse CDF x gamma (ms) |")
    print("|---|---|---|")
    for r in sampling:
        print(f"| {r['batch']} | {r['multinomial_ms']} | {r['inverse_cdf_ms']} |")
    Path(args.out).write_text(json.dumps({"threads": args.threads, "V": V, "draft_vocab": VD, "gamma": GAMMA,
                                          "rows": rows, "draft_sampling": sampling}, indent=2))


if __name__ == "__main__":
    main()
