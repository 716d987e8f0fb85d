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


def load_prompts(path: str, limit: int = 0, exclude: set[str] | frozenset = frozenset()) -> list[str]:
    """First user turn of each row; with a limit below the row count, shuffle (fixed seed) then truncate.
    Rows whose prompt key (see prompt_key) is in `exclude` are dropped first."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    turns = [t for t in (r["turns"][0] for r in rows) if prompt_key(t) not in exclude]
    if limit and limit < len(turns):
        random.Random(SHUFFLE_SEED).shuffle(turns)
        turns = turns[:limit]
    return turns


BENCH_ROWS = 32  # the served benchmarks' eval mix reads each set's first rows in file order (bench/prompts.py)


def calibration_prompts(path: str, n: int, eval_limit: int, bench_rows: int = BENCH_ROWS) -> list[str]:
    """A dev slice of an eval set for fitting calibration: n prompts that neither the acceptance eval (the first
    `eval_limit` of the shuffled order, see load_prompts) nor the served benchmarks (the first `bench_rows` rows)
    use, taken from the end of the shuffled order so that they do not depend on eval_limit."""
    turns = load_prompts(path)  # file order
    taken = set(turns[:bench_rows]) | set(load_prompts(path, eval_limit) if eval_limit else turns)
    order = list(turns)
    random.Random(SHUFFLE_SEED).shuffle(order)
    free = [t for t in reversed(order) if t not in taken]
    if len(free) < n:
        raise ValueError(f"{path}: only {len(free)} prompts outside the eval and benchmark slices, {n} wanted")
    return free[:n]


def dataset_name(path: str) -> str:
    return Path(path).stem


def prompt_key(prompt: str) -> str:
    # `train generate` keeps only the first MAX_PROMPT_CHARS of a prompt, so that prefix identifies it
    from ..train.generate import MAX_PROMPT_CHARS

    return prompt[:MAX_PROMPT_CHARS]


def used_prompts(path: str) -> set[str]:
    """Prompt keys of a training-data JSONL (`{"messages": [...]}` rows) or a prompt set (`{"turns": [...]}`): what
    a calibration or evaluation run must not reuse."""
    keys = set()
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if "turns" in row:
                keys.add(prompt_key(row["turns"][0]))
            else:
                keys.update(prompt_key(m["content"]) for m in row.get("messages", []) if m.get("role") == "user")
    return keys
