"""Stage `extra-text`: turn training prompts into distillation conversations without generating.

Regenerating responses on a 2-core CPU yields ~25 tokens/s, so we add text the drafter can learn from cheaply:
each training prompt becomes the assistant turn of a conversation. The losses distil the target's own next-token
distribution at every position (TV/L1 on soft labels, confidence on 1-TV); only the small CE term (weight 0.1)
uses the text's literal next token. Documented deviation from the reference recipe, which regenerates everything.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sglang_dspark.train.generate import DEFAULT_SOURCES, _load_prompt_rows


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/data/extra_text.jsonl")
    p.add_argument("--sources", nargs="+", default=DEFAULT_SOURCES)
    p.add_argument("--skip-ids-from", default="runs/data/generated.jsonl",
                   help="prompts already regenerated are not reused")
    p.add_argument("--limit", type=int, default=400)
    p.add_argument("--offset", type=int, default=0, help="skip this many prompts of the interleaved list first")
    p.add_argument("--max-chars", type=int, default=2000)


def run(args: argparse.Namespace) -> None:
    skip = set()
    if args.skip_ids_from and Path(args.skip_ids_from).exists():
        with open(args.skip_ids_from) as f:
            skip = {json.loads(line)["id"] for line in f if line.strip()}
    rows = [r for r in _load_prompt_rows(args.sources)[args.offset:] if r[0] not in skip][: args.limit]
    write_text_conversations(rows, args.out, args.max_chars)
    print(f"extra-text: {len(rows)} conversations -> {args.out}")


def write_text_conversations(rows: list[tuple[str, str, str]], out: str | Path, max_chars: int | None = None) -> None:
    """(id, source, text) rows as conversations whose assistant turn is the text itself."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for rid, src, text in rows:
            f.write(json.dumps({"id": f"text-{rid}", "source": src, "messages": [
                {"role": "user", "content": "Write out the following text."},
                {"role": "assistant", "content": text[:max_chars]}]}) + "\n")
