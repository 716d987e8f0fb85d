"""Retrieval proposals for one decode step, beside the drafter's block: per request, the best of its prompt /
output lookup chain, the cross-request corpus chain (retrieval_corpus.py) and the n-gram table's chain (retrieval/
ngram_table.py, a static table of the target's own answers, part of the `corpus` mode), each with calibrated
per-position confidences (retrieval.RetrievalConfidence) on the drafter's scale, so the controller can pick the
source per request and schedule both with the same survival curve.

Structured-output requests are left to the grammar walk (grammar.py: it copies from the same lookup, masked).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sglang_dspark.retrieval import Candidate, NgramTable, RetrievalConfidence, prompt_candidate
from sglang_dspark.retrieval.confidence import FILE_NAME, HISTORY_NONE, history_state
from sglang_dspark.sglang_plugin.request_params import retrieval_modes
from sglang_dspark.sglang_plugin.stats import SOURCE_NAMES, SOURCE_PROMPT, SOURCE_TABLE

logger = logging.getLogger(__name__)

MODES = ("off", "prompt", "corpus", "both")
TABLE_FILE = "ngram_table.npz"  # the drafter folder's n-gram table of the target's own answers
EXPLORE_OBSERVATIONS = 16  # verify outcomes a confidence cell needs before its chains are priced like the drafter's
HISTORY_REQUESTS = 8192  # requests whose last chain outcomes are kept (finished ones are dropped at once)


@dataclass
class RetrievalProposal:
    tokens: torch.Tensor  # Long[R, G] (zeros past each chain)
    probs: torch.Tensor  # Float32[R, G]: calibrated conditional acceptance, 0 past each chain
    candidates: list  # per request: the Candidate proposed, or None
    rids: list  # per request: its rid (the key of its chain history)
    unexplored: torch.Tensor | None = None  # Bool[R]: its confidence cell has seen few verify outcomes yet

    def has(self) -> torch.Tensor:
        return torch.tensor([c is not None for c in self.candidates], dtype=torch.bool)


class RetrievalDrafter:
    def __init__(self, gamma: int, mode: str, drafter_dir: str | None, ngram_table: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"--dspark-retrieval must be one of {MODES}, got {mode!r}")
        self.gamma, self.mode = gamma, mode
        path = Path(drafter_dir) / FILE_NAME if drafter_dir else None
        self.conf = RetrievalConfidence.from_file(gamma, path)
        if path is not None and path.exists():
            logger.info("DSPARK_EXT retrieval confidences: prior from %s", path)
        self.corpus = None
        self.table = None
        if mode in ("corpus", "both"):
            from sglang_dspark.sglang_plugin.retrieval_corpus import OutputCorpus

            self.corpus = OutputCorpus.create(gamma)
            self.table = load_ngram_table(ngram_table, drafter_dir)
        self._history: OrderedDict[str, dict[int, int]] = OrderedDict()  # rid -> {source: confidence.HISTORY_*}

    def history(self, rid: str, source: int) -> int:
        return self._history.get(rid, {}).get(source, HISTORY_NONE)

    def forget(self, rid: str) -> None:
        self._history.pop(rid, None)

    def observe_batch(self, reqs) -> None:
        """Every decode step: feed the corpus with what the batch committed."""
        if self.corpus is not None:
            self.corpus.add_outputs(reqs)

    def propose(self, reqs, eligible: torch.Tensor) -> RetrievalProposal | None:
        """eligible Bool[R]: requests that may get a retrieval chain (no grammar, speculation not switched off)."""
        R, G = len(reqs), self.gamma
        modes = retrieval_modes(reqs, self.mode)
        want_prompt = [bool(eligible[i]) and modes[i] in ("prompt", "both") for i in range(R)]
        want_corpus = [bool(eligible[i]) and modes[i] in ("corpus", "both") and
                       (self.corpus is not None or self.table is not None) for i in range(R)]
        if not any(want_prompt) and not any(want_corpus):
            return None
        contexts = [token_context(r) if (want_prompt[i] or want_corpus[i]) else None for i, r in enumerate(reqs)]
        corpus, table = [None] * R, [None] * R
        rows = [i for i in range(R) if want_corpus[i]]
        if rows and self.corpus is not None:
            for i, cand in zip(rows, self.corpus.candidates([reqs[i].rid for i in rows], [contexts[i] for i in rows])):
                corpus[i] = cand
        if rows and self.table is not None:
            for i, cand in zip(rows, self.table.candidates([contexts[i] for i in rows], G, SOURCE_TABLE)):
                table[i] = cand
        tokens = torch.zeros(R, G, dtype=torch.int64)
        probs = torch.zeros(R, G, dtype=torch.float32)
        chosen: list[Candidate | None] = [None] * R
        for i in range(R):
            best, best_value = None, 0.0
            options = [prompt_candidate(contexts[i], G, SOURCE_PROMPT) if want_prompt[i] else None, corpus[i],
                       table[i]]
            for cand in options:
                if cand is None:
                    continue
                n = min(G, cand.tokens.size)
                cand.history = self.history(reqs[i].rid, cand.source)
                p = self.conf.probs(SOURCE_NAMES[cand.source], cand.match_len, cand.count, n, cand.history,
                                    cand.match_lens, cand.counts)
                value = float(np.cumprod(p).sum())
                if value > best_value:
                    best, best_value, best_p = cand, value, p
            if best is not None:
                n = best_p.size
                tokens[i, :n] = torch.from_numpy(best.tokens[:n])
                probs[i, :n] = torch.from_numpy(best_p.astype(np.float32))
                chosen[i] = best
        if all(c is None for c in chosen):
            return None
        unexplored = torch.tensor([c is not None and self.conf.observations(
            SOURCE_NAMES[c.source], c.match_len, c.count, c.history) < EXPLORE_OBSERVATIONS for c in chosen],
            dtype=torch.bool)
        return RetrievalProposal(tokens, probs, chosen, [r.rid for r in reqs], unexplored)

    def observe(self, proposal: RetrievalProposal, used: torch.Tensor, verify_lens: torch.Tensor,
                accept_lens: torch.Tensor) -> None:
        """Refine the confidence cells with the verify outcome of every chain the step used, and remember how each
        ended: the request's next chain of that source is looked up under it."""
        for i in torch.nonzero(used).view(-1).tolist():
            cand = proposal.candidates[i]
            v = int(verify_lens[i])
            if cand is None or v <= 0:
                continue
            a = int(accept_lens[i])
            self.conf.observe(SOURCE_NAMES[cand.source], cand.match_len, cand.count, proposal.probs[i].numpy(), v, a,
                              cand.history, cand.match_lens, cand.counts)
            rid = proposal.rids[i]
            self._history.setdefault(rid, {})[cand.source] = history_state(v, a)
            self._history.move_to_end(rid)
            while len(self._history) > HISTORY_REQUESTS:  # requests that ended without a finish notice
                self._history.popitem(last=False)

    def ece(self) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """Per source: the served ECE per position and its label-noise floor (RetrievalConfidence.windowed_ece)."""
        both = {s: self.conf.windowed_ece(s) for s in self.conf.sources}
        return {s: e for s, (e, _) in both.items()}, {s: f for s, (_, f) in both.items()}

    def served_ece(self) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[int]]]:
        """Per source, over every prediction served since start-up: ECE per position, its floor, and how many
        predictions each position's reading is over (RetrievalConfidence.served_ece)."""
        both = {s: self.conf.served_ece(s) for s in self.conf.sources}
        return ({s: e for s, (e, _) in both.items()}, {s: f for s, (_, f) in both.items()},
                {s: self.conf.scored(s, window=False) for s in self.conf.sources})


def token_context(req) -> np.ndarray:
    """A request's prompt + output tokens so far (SGLang keeps both as array('q'))."""
    return np.concatenate([np.asarray(req.origin_input_ids, dtype=np.int64),
                           np.asarray(req.output_ids, dtype=np.int64)])


def load_ngram_table(setting: str, drafter_dir: str | None) -> NgramTable | None:
    """--dspark-ngram-table: 'off', 'auto' (the drafter's TABLE_FILE if it ships one) or a path, which must exist.
    A malformed file raises ValueError with the reason: the server stops at start-up rather than serve without it."""
    if setting == "off":
        return None
    if setting == "auto":
        path = Path(drafter_dir) / TABLE_FILE if drafter_dir else None
        if path is None or not path.exists():
            return None
    else:
        path = Path(setting)
        if not path.exists():
            raise ValueError(f"--dspark-ngram-table {setting}: no such file")
    table = NgramTable.load(path)
    logger.info("DSPARK_EXT n-gram table: %s (%d answer tokens, orders %s)", path, table.tokens, table.orders)
    return table
