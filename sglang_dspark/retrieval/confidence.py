"""Calibrated confidence for retrieval drafts: P(draft k accepted | drafts < k accepted, source, match-length
bucket, count bucket, the request's history), the same conditional quantity the drafter's confidence head predicts,
so the controller can compare and schedule both kinds of proposal with one survival curve (the cumulative product).

The history is how the request's last verified chain of the same source ended (none yet, first draft rejected,
partly accepted, all accepted): whether a request copies is mostly a property of the request (an edit copies its
prompt, a chat answer rarely does), which match length and count alone cannot tell apart.

Each cell is a Beta posterior per draft position: a prior (fitted offline from greedy target outputs, fit_table, or
the built-in one) refined online by every verify outcome. Served predictions are scored before they are refined:
ece() is the per-position ECE of predicted prefix survival against "drafts 0..k all accepted", on the positions
actually verified, over the last ECE_WINDOW scored predictions per position (the drafter's calibration monitor
likewise restarts its statistics at every refit); ece(..., window=False) is over everything served.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

MATCH_LEN_EDGES = (1, 2, 3, 4, 6, 8, 12)  # bucket b holds match lengths in [EDGES[b], EDGES[b + 1])
COUNT_EDGES = (1, 2, 4, 8)
PRIOR_STRENGTH = 4.0  # pseudo-observations of the built-in prior per cell and position
ECE_BINS = 20
ECE_WINDOW = 1024  # served predictions per position the reported ECE is over: the current calibration, not the cold start
CELL_MEMORY = 512.0  # outcomes a cell keeps per position: older ones fade, so a cell follows a changing request mix
FILE_NAME = "retrieval_confidence.json"
FORMAT_VERSION = 2  # 2: a history axis; version 1 files (no history) load as the same prior for every history
HISTORY_NONE, HISTORY_REJECTED, HISTORY_PARTIAL, HISTORY_FULL = range(4)
HISTORY_STATES = 4
# sources whose cells pool the match-length and history axes: the n-gram table's drafts are spread over 7 orders x 4
# grades x 4 histories, so per cell a served run sees too few outcomes to correct its prior (c = 1, 2026-12-07:
# position 2 predicted 0.54, accepted 0.39, windowed ECE twice its floor); pooled by grade and position, every
# outcome refines the cell all its peers use (served, same A/B: 4.7-13.3% against floors of 3.4-6.8%, was 6.2-20%)
POOLED_SOURCES = ("table",)


def history_state(verified: int, accepted: int) -> int:
    """How a verified chain ended, as the history its request's next chain of that source is looked up under."""
    if accepted <= 0:
        return HISTORY_REJECTED
    return HISTORY_FULL if accepted >= verified else HISTORY_PARTIAL


def _bucket(value: int, edges) -> int:
    return max(0, int(np.searchsorted(edges, value, side="right")) - 1)


TABLE_GRADE_PRIOR = (0.2, 0.35, 0.5, 0.75)  # n-gram table: acceptance per evidence grade (ngram_table.grade)


def builtin_prior(source: str, match_bucket: int, gamma: int, count_bucket: int = 0) -> np.ndarray:
    """Float[gamma, 2] Beta (alpha, beta): longer matches continue more often, later positions a little more
    (a chain that survived k drafts is on a copied stretch). Refined within a few hundred verified positions."""
    if source == "table":  # its count axis is the evidence grade of the table's own next-token frequency
        base = TABLE_GRADE_PRIOR[count_bucket] + 0.02 * match_bucket
    elif source == "prompt":
        base = 0.2 + 0.07 * match_bucket
    else:  # the corpus starts lower: its chains come from other requests and its trie reports no match length
        base = 0.1 + 0.04 * match_bucket
    p = np.clip(base + 0.04 * np.arange(gamma), 0.05, 0.9)
    return np.stack([p * PRIOR_STRENGTH, (1 - p) * PRIOR_STRENGTH], axis=1)


class RetrievalConfidence:
    def __init__(self, gamma: int, sources=("prompt", "corpus", "table"), prior: dict | None = None):
        self.gamma = gamma
        self.sources = tuple(sources)
        shape = (len(MATCH_LEN_EDGES), len(COUNT_EDGES), HISTORY_STATES, gamma, 2)
        self.table = {s: np.zeros(shape) for s in self.sources}
        for s in self.sources:
            for m in range(shape[0]):
                for c in range(shape[1]):
                    self.table[s][m, c, :] = builtin_prior(s, m, gamma, c)
        if prior is not None:
            self.load_prior(prior)
        # per source: [gamma, bins] sums of predicted survival, of realised labels, counts and p (1 - p) (binned ECE
        # over everything served, and its label-noise floor)
        self._ece_sums = {s: np.zeros((4, gamma, ECE_BINS)) for s in self.sources}
        # per source: ring of the last ECE_WINDOW (predicted survival, label) per position; NaN = empty slot
        self._recent = {s: np.full((2, gamma, ECE_WINDOW), np.nan) for s in self.sources}
        self._recent_next = {s: np.zeros(gamma, dtype=np.int64) for s in self.sources}

    # ------------------------------------------------------------------ prediction
    def cell(self, match_len: int, count: int) -> tuple[int, int]:
        return _bucket(match_len, MATCH_LEN_EDGES), _bucket(count, COUNT_EDGES)

    def cells(self, match_len: int, count: int, n: int, match_lens=None, counts=None) -> tuple[np.ndarray, np.ndarray]:
        """(match bucket, count bucket) per position: the chain's own per-position evidence where it has some (the
        n-gram table's chains: each draft was predicted from its own context), else its first position's."""
        if match_lens is None:
            m, c = self.cell(match_len, count)
            return np.full(n, m), np.full(n, c)
        m = np.maximum(np.searchsorted(MATCH_LEN_EDGES, np.asarray(match_lens[:n]), side="right") - 1, 0)
        c = np.maximum(np.searchsorted(COUNT_EDGES, np.asarray(counts[:n]), side="right") - 1, 0)
        return m, c

    def probs(self, source: str, match_len: int, count: int, n: int, history: int = HISTORY_NONE,
              match_lens=None, counts=None) -> np.ndarray:
        """Float[n] conditional acceptance probability of the chain's first n positions (n <= gamma)."""
        m, c = self.cells(match_len, count, n, match_lens, counts)
        m, history = self._pool(source, m, history)
        ab = self.table[source][m, c, history, np.arange(n)]
        return ab[:, 0] / ab.sum(1)

    def observations(self, source: str, match_len: int, count: int, history: int = HISTORY_NONE) -> int:
        """Outcomes behind the cell's first position beyond the built-in prior's pseudo-counts: online verify
        outcomes, plus those of a fitted prior (fit_table's counts are real evidence, so its cells start explored)."""
        m, c = self.cell(match_len, count)
        m, history = self._pool(source, m, history)
        return max(0, int(round(float(self.table[source][m, c, history, 0].sum()) - PRIOR_STRENGTH)))

    @staticmethod
    def _pool(source: str, m, history: int):
        """(match bucket(s), history) a source's cell is indexed by: POOLED_SOURCES use bucket 0 and no history."""
        if source in POOLED_SOURCES:
            return np.zeros_like(m), HISTORY_NONE
        return m, history

    # ------------------------------------------------------------------ learning
    def observe(self, source: str, match_len: int, count: int, predicted: np.ndarray, verified: int,
                accepted: int, history: int = HISTORY_NONE, match_lens=None, counts=None) -> None:
        """One verify outcome of a chain: `verified` drafts checked, the first `accepted` of them accepted.
        predicted: the conditional probabilities served for it (scored for ECE before the cell is refined)."""
        if verified <= 0:
            return
        survival = np.cumprod(np.asarray(predicted[:verified], dtype=np.float64))
        k = np.arange(verified)
        bins = np.clip((survival * ECE_BINS).astype(int), 0, ECE_BINS - 1)
        sums = self._ece_sums[source]
        np.add.at(sums[0], (k, bins), survival)
        np.add.at(sums[1], (k, bins), (k < accepted).astype(np.float64))
        np.add.at(sums[2], (k, bins), 1.0)
        np.add.at(sums[3], (k, bins), survival * (1 - survival))
        ring, nxt = self._recent[source], self._recent_next[source]
        slot = nxt[k] % ECE_WINDOW
        ring[0, k, slot], ring[1, k, slot] = survival, (k < accepted)
        nxt[k] += 1
        reached = min(accepted + 1, verified)  # position `accepted` was the first rejected one; later ones unseen
        m, c = self.cells(match_len, count, reached, match_lens, counts)
        m, history = self._pool(source, m, history)
        pos = np.arange(reached)
        t = self.table[source]
        t[m, c, history, pos, (pos >= accepted).astype(int)] += 1.0
        mass = t[m, c, history, pos].sum(-1, keepdims=True)
        t[m, c, history, pos] *= np.where(mass > CELL_MEMORY, CELL_MEMORY / mass, 1.0)

    def ece(self, source: str, window: bool = True) -> list[float]:
        """Per draft position: binned ECE of the served survival predictions, over the last ECE_WINDOW of them
        (window=False: all of them); NaN where nothing was scored."""
        if not window:
            return self.served_ece(source)[0]
        return self.windowed_ece(source)[0]

    def served_ece(self, source: str) -> tuple[list[float], list[float]]:
        """(ECE, its label-noise floor) per draft position over every prediction served since start-up: the
        windowed reading's noise floor (~3% at 1024 predictions) cannot show a 3% calibration, this one's falls as
        1 / sqrt(predictions). NaN where nothing was scored."""
        pred, label, count, var = self._ece_sums[source]
        n = count.sum(1)
        gap = np.abs(pred - label).sum(1)
        floor = np.sqrt(2 * var / np.pi).sum(1)
        return ([float(g / m) if m else float("nan") for g, m in zip(gap, n)],
                [float(f / m) if m else float("nan") for f, m in zip(floor, n)])

    def ece_floor(self, source: str) -> list[float]:
        """Per draft position: the ECE a perfectly calibrated predictor would show on the same windowed predictions
        (ece() is biased up by label noise). Under calibration a bin's sum of (prediction - label) has variance
        V_b = sum p (1 - p), so E|sum| ~ sqrt(2 V_b / pi): floor = sum_b sqrt(2 V_b / pi) / n. On 1024 predictions
        spread over the bins that is ~3%: a window's ECE is read against it."""
        return self.windowed_ece(source)[1]

    def windowed_ece(self, source: str) -> tuple[list[float], list[float]]:
        """(ece(), ece_floor()) per draft position, in one pass over the window; NaN where nothing was scored."""
        eces, floors = [], []
        for pred, label in zip(*self._recent[source]):
            keep = ~np.isnan(pred)
            if not keep.any():
                eces.append(float("nan"))
                floors.append(float("nan"))
                continue
            pred, label = pred[keep], label[keep]
            bins = np.clip((pred * ECE_BINS).astype(int), 0, ECE_BINS - 1)
            gap = np.bincount(bins, weights=pred - label, minlength=ECE_BINS)
            var = np.bincount(bins, weights=pred * (1 - pred), minlength=ECE_BINS)
            eces.append(float(np.abs(gap).sum() / pred.size))
            floors.append(float(np.sqrt(2 * var / np.pi).sum() / pred.size))
        return eces, floors

    def scored(self, source: str, window: bool = True) -> list[int]:
        """Per draft position: how many served predictions ece() is over."""
        if window:
            return [int(x) for x in np.minimum(self._recent_next[source], ECE_WINDOW)]
        return [int(x) for x in self._ece_sums[source][2].sum(1)]

    # ------------------------------------------------------------------ persistence
    def to_json(self) -> dict:
        return {"version": FORMAT_VERSION, "gamma": self.gamma, "match_len_edges": list(MATCH_LEN_EDGES),
                "count_edges": list(COUNT_EDGES), "history_states": HISTORY_STATES,
                "table": {s: t.tolist() for s, t in self.table.items()}}

    def load_prior(self, data: dict) -> None:
        version = data.get("version")
        if version not in (1, FORMAT_VERSION):
            raise ValueError(f"retrieval confidence: unsupported version {version!r}")
        if version == FORMAT_VERSION and data.get("history_states") != HISTORY_STATES:
            raise ValueError(f"retrieval confidence: {data.get('history_states')!r} history states, this version "
                             f"has {HISTORY_STATES}")
        if list(data.get("match_len_edges", [])) != list(MATCH_LEN_EDGES) or \
                list(data.get("count_edges", [])) != list(COUNT_EDGES):
            raise ValueError("retrieval confidence: bucket edges differ from this version's")
        for s, rows in data.get("table", {}).items():
            if s not in self.table:
                continue
            arr = np.asarray(rows, dtype=np.float64)
            if version == 1 and arr.ndim == 4:  # no history axis: the same prior under every history
                arr = np.repeat(arr[:, :, None], HISTORY_STATES, axis=2)
            if arr.ndim != 5 or arr.shape[:3] != self.table[s].shape[:3] or arr.shape[4] != 2 or \
                    not np.isfinite(arr).all() or (arr <= 0).any():
                raise ValueError(f"retrieval confidence: table {s!r} has shape {arr.shape} or non-positive counts")
            g = min(self.gamma, arr.shape[3])
            self.table[s][:, :, :, :g] = arr[:, :, :, :g]

    @classmethod
    def from_file(cls, gamma: int, path: str | Path | None,
                  sources=("prompt", "corpus", "table")) -> "RetrievalConfidence":
        if path is None or not Path(path).exists():
            return cls(gamma, sources)
        return cls(gamma, sources, prior=json.loads(Path(path).read_text()))


PRIOR_CAP = 8.0  # pseudo-counts a fitted cell keeps per position (see fit_table)


def served_chains(prompt, output, gamma: int, start: int = 0, propose=None):
    """The chains a T = 0 server verifying every whole chain would meet in a greedy output, from output position
    `start` on: (candidate, verified, accepted, history before it) per step; the walk then moves past the accepted
    drafts and the bonus token (exact at T = 0: greedy outputs do not depend on speculation). propose(context,
    gamma) -> Candidate | None draws the chains (default: prompt/output lookup)."""
    from .lookup import prompt_candidate

    if propose is None:
        def propose(context, n):
            return prompt_candidate(context, n, source=1)
    ctx = np.concatenate([np.asarray(prompt, dtype=np.int64), np.asarray(output, dtype=np.int64)])
    P, t, history = len(prompt), start, HISTORY_NONE
    while t < len(output):
        cand = propose(ctx[: P + t], gamma)
        if cand is None:
            t += 1
            continue
        truth = ctx[P + t: P + t + cand.tokens.size]
        n = truth.size
        same = cand.tokens[:n] == truth
        accepted = int(np.argmin(same)) if not same.all() else n
        yield cand, n, accepted, history
        history = history_state(n, accepted)
        t += accepted + 1


def fit_table(sequences, gamma: int, max_prior: float = PRIOR_CAP, source: str = "prompt",
              proposers=None) -> RetrievalConfidence:
    """Offline prior from greedy target outputs: per (prompt ids, output ids) pair, `gamma` served_chains walks
    (starting at output positions 0..gamma-1), each chain observed under the history its walk had. Counts are capped
    at `max_prior` per cell and position: requests differ more than cells tell, so the prior only has to start a
    cell near its population rate and let the request mix served take over within a few outcomes
    (benchmarks/retrieval_prior_study.py: capped at 8, online ECE 2-3% on held-out answers; capped at 200, 8-9%).
    source / proposers: which source's cells are fitted, from which chains: one served_chains `propose` per sequence
    (a table that never saw that sequence's own prompt family, say; default: prompt lookup's)."""
    conf = RetrievalConfidence(gamma, sources=(source,))
    for i, (prompt, output) in enumerate(sequences):
        draw = proposers[i] if proposers is not None else None
        for start in range(min(gamma, len(output))):
            for cand, n, accepted, history in served_chains(prompt, output, gamma, start, draw):
                extra = {"match_lens": cand.match_lens, "counts": cand.counts}
                conf.observe(source, cand.match_len, cand.count,
                             conf.probs(source, cand.match_len, cand.count, n, history, **extra), n, accepted,
                             history, **extra)
    t = conf.table[source]
    total = t.sum(-1, keepdims=True)
    conf.table[source] = np.where(total > max_prior, t * (max_prior / np.maximum(total, 1e-9)), t)
    return conf
