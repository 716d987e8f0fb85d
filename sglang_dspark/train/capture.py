"""`capture`: conversations JSONL -> target feature cache (reference §4.1 step 3, §4.2, §4.3)."""

from __future__ import annotations

import json
import os

import torch
from tqdm import tqdm

from ..drafter.config import default_target_layer_ids
from .cache import CacheWriter, bytes_per_token
from .chat import template_markers, tokenize_conversation
from .target import HFTarget, read_target_config


def read_conversations(path: str) -> list[tuple[str, list[dict]]]:
    """Rows {"id", "messages": [{"role", "content"}, ...]} ("conversations" accepted as an alias)."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            msgs = row.get("messages", row.get("conversations"))
            if msgs is None:
                raise ValueError(f"{path}:{n + 1}: row has neither 'messages' nor 'conversations'")
            rows.append((str(row.get("id", f"{os.path.basename(path)}:{n}")), msgs))
    return rows


def _dtype(name: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
            "fp16": torch.float16}[name]


def run_capture(args) -> dict:
    from transformers import AutoTokenizer

    tcfg = read_target_config(args.target)
    num_layers = tcfg["num_hidden_layers"]
    layer_ids = args.target_layer_ids or default_target_layer_ids(num_layers, args.num_target_features)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    manifest = dict(target=os.path.abspath(args.target), target_layer_ids=layer_ids,
                    hidden_size=tcfg["hidden_size"], num_target_layers=num_layers, vocab_size=tcfg["vocab_size"],
                    tokenizer_size=len(tokenizer), max_length=args.max_length,
                    min_loss_tokens=args.min_loss_tokens, system_prompt=args.system_prompt,
                    hidden_dtype="bfloat16", sources=[os.path.abspath(p) for p in args.data])
    writer = CacheWriter(args.out, manifest, shard_samples=args.shard_samples)

    markers = template_markers(tokenizer)
    todo, skipped = [], 0
    for path in args.data:
        for sid, msgs in read_conversations(path):
            if sid in writer.done:
                continue
            ids, mask = tokenize_conversation(tokenizer, msgs, args.max_length, markers, args.system_prompt or None)
            if sum(mask) < args.min_loss_tokens:
                skipped += 1
                continue
            todo.append((sid, ids, mask))
    if args.limit:
        todo = todo[: args.limit]
    tokens = sum(len(ids) for _, ids, _ in todo)
    est = tokens * bytes_per_token(tcfg["hidden_size"], len(layer_ids))
    print(f"[capture] {len(writer.done)} samples already cached, {len(todo)} to capture ({tokens} tokens, "
          f"{skipped} skipped with < {args.min_loss_tokens} loss tokens); estimated size {est / 2**30:.3f} GiB")
    if not todo:
        return {"captured": 0, "bytes_estimate": 0}

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target = HFTarget(args.target, layer_ids, dtype=_dtype(args.dtype), device=device)
    for sid, ids, mask in tqdm(todo, desc="capture", unit="sample"):
        input_ids = torch.tensor([ids], device=target.device)
        last, feats = target.forward(input_ids)
        writer.add(sid, ids, mask, feats[0], last[0])
    writer.flush()
    return {"captured": len(todo), "bytes_estimate": est}
