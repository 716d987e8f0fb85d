"""Stage `draft-vocab`: count the tokens of the assistant turns in conversation JSONL files and write the reduced
draft vocabulary (drafter/draft_vocab.py) next to a drafter checkpoint."""

from __future__ import annotations

import argparse
import json
import os

import torch
from tqdm import tqdm

from sglang_dspark.drafter.config import DSparkConfig
from sglang_dspark.drafter.draft_vocab import DRAFT_VOCAB_NAME, build_draft_vocab, coverage, save_draft_vocab


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, action="append", help="JSONL of {messages: [...]}; repeatable")
    p.add_argument("--drafter", required=True, help="checkpoint dir; writes <drafter>/draft_vocab.safetensors")
    p.add_argument("--target", default=None, help="tokenizer dir (default: embedded model)")
    p.add_argument("--size", type=int, default=32768, help="number of draft token ids")


def count_tokens(paths: list[str], tokenizer, vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    for row in tqdm(rows, desc="count tokens", unit="conv"):
        for m in row.get("messages", []):
            if m.get("role") == "assistant" and m.get("content"):
                ids = torch.tensor(tokenizer.encode(m["content"], add_special_tokens=False), dtype=torch.int64)
                ids = ids[ids < vocab_size]
                counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from sglang_dspark.embedded import DEFAULT_TARGET_DIR

    cfg = DSparkConfig.from_json(os.path.join(args.drafter, "config.json"))
    tok = AutoTokenizer.from_pretrained(args.target or str(DEFAULT_TARGET_DIR))
    counts = count_tokens(args.data, tok, cfg.vocab_size)
    # stop tokens must stay proposable, or a draft could never end a turn
    always = {i for i in (tok.eos_token_id, tok.pad_token_id) if isinstance(i, int)}
    always |= {i for i in tok.all_special_ids if i < cfg.vocab_size}
    ids = build_draft_vocab(counts, args.size, tuple(sorted(always)))
    cov = coverage(ids, counts)
    out = os.path.join(args.drafter, DRAFT_VOCAB_NAME)
    save_draft_vocab(out, ids, cov)
    seen = int((counts > 0).sum())
    summary = {"size": int(ids.numel()), "counted_tokens": int(counts.sum()), "distinct_seen": seen,
               "coverage": round(cov, 6), "out": out}
    print(summary, flush=True)
    return summary
