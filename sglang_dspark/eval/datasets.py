"""Eval prompt sets: JSONL rows {"turns": [...]}, first turn only (reference §5)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

DEFAULT_EVAL_SETS = ("gsm8k", "humaneval", "mt-bench")
SHUFFLE_SEED = 980406


def data_dir() -> Path:
    """$SGLANG_DSPARK_DATA, else ../shared/data next to the repository."""
    env = os.environ.get("SGLANG_DSPARK_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def default_datasets() -> list[str]:
    return [str(data_dir() / "eval" / f"{name}.jsonl") for name in DEFAULT_EVAL_SETS]


def load_prompts(path: str, limit: int = 0) -> list[str]:
    """First user turn of each row; with a limit below the row count, shuffle (fixed seed) then truncate."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    turns = [r["turns"][0] for r in rows]
    if limit and limit < len(turns):
        random.Random(SHUFFLE_SEED).shuffle(turns)
        turns = turns[:limit]
    return turns


def dataset_name(path: str) -> str:
    return Path(path).stem
