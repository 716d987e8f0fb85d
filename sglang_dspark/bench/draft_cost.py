"""`python -m sglang_dspark.bench draft_cost`: one draft pass (backbone + Markov head + confidence) vs one target
forward of gamma+1 tokens, at batch 1 and 16, in the serving dtype (HF target with a KV cache; our drafter with
its cached context K/V)."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from sglang_dspark.bench.report import markdown_table, update_section, write_json
from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=str(DEFAULT_TARGET_DIR))
    p.add_argument("--drafter", default=str(DEFAULT_DRAFTER_DIR))
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", default="draft_cost.json")


def median_time(fn, repeats: int) -> float:
    """Median wall seconds of fn() over `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def draft_inputs(cfg, batch: int, context: int, dtype: torch.dtype) -> tuple:
    """`propose` arguments for a greedy draft pass of `batch` requests over `context` cached positions of random K/V."""
    k = torch.randn(cfg.num_hidden_layers, batch, context, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype)
    return (torch.randint(0, 1000, (batch,)), torch.full((batch,), context), k, torch.randn_like(k),
            torch.ones(batch, context, dtype=torch.bool), torch.zeros(batch))


@torch.no_grad()
def run(args: argparse.Namespace) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from sglang_dspark.drafter.checkpoint import load_drafter

    dtype = getattr(torch, args.dtype)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).eval()
    embed = target.get_input_embeddings().weight
    lm_head = target.get_output_embeddings().weight
    drafter = load_drafter(args.drafter, target_embed=embed, target_lm_head=lm_head, dtype=dtype)
    reduced = drafter.draft_vocab
    cfg = drafter.config
    G = cfg.block_size
    rows = []
    for bs in args.batch:
        ctx_ids = torch.randint(0, 1000, (bs, args.context))
        out = target(ctx_ids, use_cache=True)
        cache = out.past_key_values
        new_ids = torch.randint(0, 1000, (bs, G + 1))

        copies = [_crop_copy(cache, args.context) for _ in range(args.repeats + 1)]  # copying is not timed

        def target_step():
            target(new_ids, past_key_values=copies.pop(), use_cache=True)

        C = args.context
        inputs = draft_inputs(cfg, bs, C, dtype)

        def draft_step():
            drafter.propose(*inputs)

        t_target = median_time(target_step, args.repeats)
        for vocab in ([None, reduced] if reduced is not None else [None]):
            drafter.set_draft_vocab(vocab)
            t_draft = median_time(draft_step, args.repeats)
            row = {"batch": bs, "context": C, "gamma": G,
                   "draft_vocab": cfg.vocab_size if vocab is None else int(vocab.numel()),
                   "target_forward_ms": round(1e3 * t_target, 2), "draft_pass_ms": round(1e3 * t_draft, 2),
                   "draft_over_target": round(t_draft / t_target, 3)}
            rows.append(row)
            print(row, flush=True)
        drafter.set_draft_vocab(reduced)
    write_json(args.out, {"rows": rows, "dtype": args.dtype, "threads": torch.get_num_threads()})
    update_section("draft_cost", "Command: `python -m sglang_dspark.bench draft_cost` (target forward of gamma+1 "
                   f"tokens on a {args.context}-token KV cache vs one full draft pass, {args.dtype}).\n\n"
                   + markdown_table(rows, list(rows[0])))
    return rows


def _crop_copy(cache, length: int):
    import copy

    c = copy.deepcopy(cache)
    c.crop(length)
    return c
