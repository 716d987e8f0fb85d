"""Prompt sets: the shared eval/train JSONL files (`{"turns": [...]}`), first turn only."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sglang_dspark.embedded import REPO_ROOT


def data_root() -> Path:
    env = os.environ.get("SGLANG_DSPARK_DATA")
    if env:
        return Path(env)
    for cand in (REPO_ROOT.parent / "shared" / "data", REPO_ROOT / "shared" / "data"):
        if cand.is_dir():
            return cand
    raise FileNotFoundError("prompt data not found: set SGLANG_DSPARK_DATA to the folder holding eval/ and train/")


def load_prompts(path: str | Path, limit: int | None = None) -> list[str]:
    return [text for text, _ in load_requests(path, limit)]


# standard-library modules the code-editing workload (benchmarks/workloads/make_code_edit.py) takes its functions
# from; training prompts (train/procedural.py) never use them
CODE_EDIT_MODULES = ("textwrap", "shlex", "fnmatch", "posixpath", "glob", "colorsys", "bisect", "heapq", "calendar",
                     "difflib", "string", "base64", "quopri", "csv", "json.encoder", "json.decoder", "gettext",
                     "statistics")
REQUEST_FIELDS = ("response_format",)  # per-prompt OpenAI request fields a JSONL row may carry


def load_requests(path: str | Path, limit: int | None = None) -> list[tuple[str, dict]]:
    """(first turn, extra request fields) per row; the extras are the row's REQUEST_FIELDS (e.g. a json_schema
    response_format for structured-output workloads)."""
    path = Path(path)
    if not path.exists() and not path.is_absolute():
        path = data_root() / path
    out = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            turns = row.get("turns")
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise ValueError(f"{path}:{line_no}: expected {{\"turns\": [str, ...]}}")
            out.append((turns[0], {k: row[k] for k in REQUEST_FIELDS if k in row}))
            if limit is not None and len(out) >= limit:
                break
    return out


def eval_mix(per_dataset: int) -> list[tuple[str, str]]:
    """(dataset, prompt) pairs interleaved from gsm8k, humaneval and mt-bench."""
    sets = {name: load_prompts(f"eval/{name}.jsonl", per_dataset) for name in ("gsm8k", "humaneval", "mt-bench")}
    out = []
    for i in range(per_dataset):
        for name, prompts in sets.items():
            if i < len(prompts):
                out.append((name, prompts[i]))
    return out
