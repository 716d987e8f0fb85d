"""Per-step DSpark statistics as the worker hands them to SGLang (meta_info) and to metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: metrics/request_stats (tokenizer side) imports SOURCE_NAMES from here
    import torch

# Where a request's verified drafts came from in a step (StepStats.sources); -1: nothing proposed for it.
SOURCE_NAMES = ("drafter", "prompt", "corpus", "table")
SOURCE_DRAFTER, SOURCE_PROMPT, SOURCE_CORPUS, SOURCE_TABLE = 0, 1, 2, 3


@dataclass
class StepStats:
    batch_size: int
    drafted: list[int] = field(default_factory=list)  # 1 per request drafted for (draft skipping leaves some out)
    draft_s: float = 0.0
    verify_s: float = 0.0
    verify_lens: list[int] = field(default_factory=list)
    accept_lens: list[int] = field(default_factory=list)
    fallback: str | None = None
    plain_decode: bool = False  # the step ran as SGLang's plain decode (nothing verified anywhere)
    unplanned: bool = False  # ... and skipped drafts and the plan too (control.plain_decode.PlainStreak)
    peeked: bool = False  # a plain streak's step planned for a confident retrieval chain, without a draft pass
    sla_floored: int = 0  # requests with an SLA floor this step
    sla_unsatisfied: int = 0  # of those, requests whose expected tokens/s stays below the floor
    grammar_requests: int = 0  # requests whose next tokens a grammar constrains (structured outputs)
    grammar_forced: int = 0  # draft positions where their grammar allowed one token (certain drafts)
    grammar_replaced: int = 0  # forbidden greedy drafts replaced by the drafter's best allowed token
    grammar_copied: int = 0  # draft positions copied from the grammar's jump-forward text or prompt/output lookup
    # per request: SOURCE_* of its proposal this step (the drafter's block or a retrieval chain), -1 for none
    sources: list[int] = field(default_factory=list)
    # per retrieval source name: ECE of its calibrated confidences per draft position (served steps so far)
    retrieval_ece: dict[str, list[float]] | None = None
    retrieval_ece_floor: dict[str, list[float]] | None = None  # the same windows' ECE under perfect calibration
    # the same over every prediction served since start-up, and the predictions per position behind it
    retrieval_ece_served: dict[str, list[float]] | None = None
    retrieval_ece_served_floor: dict[str, list[float]] | None = None
    retrieval_predictions: dict[str, list[int]] | None = None
    gate_rho: float | None = None  # the plain-decode gate's ratios after this step (control/plain_decode.py)
    gate_kappa: float | None = None

    def finish(self, verify_lens: torch.Tensor, accept_lens: torch.Tensor, fallback: str | None) -> None:
        self.verify_lens = verify_lens.tolist()
        self.accept_lens = accept_lens.tolist()
        self.fallback = fallback

    def row_sources(self) -> list[int]:
        """Per request (the rows of accept_lens): SOURCE_* of its verified drafts this step, -1 for none. All -1 on a
        fallback step, or when the step recorded no sources (a code path that does not fill them)."""
        rows = len(self.accept_lens)
        if self.fallback or len(self.sources) != rows:
            return [-1] * rows
        return [int(s) for s in self.sources]

    def customized_info(self, record_verify_lens: bool) -> dict[str, list]:
        """Per request, one entry per token this step commits: the step's value, then None (see api_hooks)."""
        drafted = [0] * self.batch_size if self.fallback else list(self.drafted)
        per_step = {
            "dspark_drafted": drafted,
            "dspark_verified": list(self.verify_lens),
            "dspark_accepted": list(self.accept_lens),
            "dspark_source": self.row_sources(),
        }
        if record_verify_lens:
            per_step["dspark_verify_lens"] = list(self.verify_lens)
        pads = [[None] * a for a in self.accept_lens]  # commit = accepted drafts + bonus
        return {k: [[v] + pad for v, pad in zip(vals, pads)] for k, vals in per_step.items()}

    @staticmethod
    def prefill_customized_info(batch_size: int, record_verify_lens: bool) -> dict[str, list]:
        """One empty entry for the token prefill samples, so entries stay aligned with output tokens (SGLang
        slices them by token offset when streaming)."""
        keys = ["dspark_drafted", "dspark_verified", "dspark_accepted", "dspark_source"]
        if record_verify_lens:
            keys.append("dspark_verify_lens")
        return {k: [[None] for _ in range(batch_size)] for k in keys}


@dataclass
class WorkerCounters:
    steps: int = 0
    fallbacks: int = 0
    verified: int = 0
    accepted: int = 0
    requests_finished: int = 0
    plain_decode_steps: int = 0
    last_step_s: float | None = None

    def add(self, s: StepStats) -> None:
        self.steps += 1
        self.fallbacks += s.fallback is not None
        self.plain_decode_steps += s.plain_decode
        self.verified += sum(s.verify_lens)
        self.accepted += sum(s.accept_lens)
        self.last_step_s = s.draft_s + s.verify_s


class StepTrace:
    """JSONL of every decode step (for the trace-replay simulator): what the controller saw and what happened.

    Record with `fixed:<gamma>` to learn each request's true acceptance length (every draft verified)."""

    def __init__(self, path: str):
        import os

        self.path = f"{path}.{os.getpid()}" if os.path.isdir(path) else path
        self._f = open(self.path, "a", buffering=1)

    def write(self, kv_lens, conf, conf_logits, verify_lens, accept_lens, stats: StepStats) -> None:
        import json

        self._f.write(json.dumps({
            "kv_lens": kv_lens.tolist(),
            "conf": [[round(float(x), 5) for x in row] for row in conf.cpu()],
            "conf_logits": [[round(float(x), 4) for x in row] for row in conf_logits.cpu()],
            "verify_lens": verify_lens.tolist(),
            "accept_lens": accept_lens.tolist(),
            "draft_s": round(stats.draft_s, 6),
            "verify_s": round(stats.verify_s, 6),
            "plain": bool(stats.plain_decode),  # verify_s timed SGLang's plain decode forward
            "t": round(time.time(), 4),  # wall clock at the step's end: gaps = scheduler work + prefills between
            "drafted": [int(x) for x in (stats.drafted or [])],
            "sources": stats.row_sources(),  # per request: stats.SOURCE_* of its verified drafts, -1 for none
            "unplanned": bool(stats.unplanned),
            "peeked": bool(stats.peeked),
        }) + "\n")
