"""A static n-gram table of the target's own greedy outputs: for every context of 1..8 tokens seen in them, the token
that most often followed, how often, and out of how many. Chains are drawn from it greedily, longest context first
(back-off), so a request with no copy in its prompt and no twin among recent requests still gets the phrases the
target habitually writes ("Let's break this down step by step", "```python\\ndef ", "return result\\n```").

Built once from token sequences (numpy sort, no Python loop over tokens) and queried per step with a few binary
searches. Contexts are keyed by a 64-bit polynomial hash; a collision only costs a rejected draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .lookup import Candidate

ORDERS = (1, 2, 3, 4, 5, 6, 8)  # context lengths kept, longest tried first
HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
FORMAT_VERSION = 1


def _hash_windows(tokens: np.ndarray, n: int) -> np.ndarray:
    """UInt64[len - n + 1]: hash of tokens[i : i + n] for every i (wrapping arithmetic)."""
    t = tokens.astype(np.uint64) + np.uint64(1)
    h = np.zeros(t.size - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * HASH_MUL + t[j: j + h.size]
    return h


HASH_MUL_INT = int(HASH_MUL)
MASK64 = (1 << 64) - 1


def _salt(n: int) -> np.uint64:
    return np.uint64((n * 0xD6E8FEB86659FD93) & MASK64)


MIN_SMOOTHED = 0.2
GRADE_EDGES = (0.35, 0.6, 0.85)  # smoothed frequency -> GRADES[i] (each in its own confidence.COUNT_EDGES bucket)
GRADES = np.array((1, 2, 4, 8))


def smoothed(step: "Step") -> float:
    """top / (total + 1): the next-token frequency, shrunk where the context was seen only a few times."""
    return step.top / (step.total + 1)


def grade(step: "Step") -> int:
    """Evidence grade of a prediction, 1 / 2 / 4 / 8 by its smoothed frequency: on held-out greedy answers the
    conditional acceptance rises ~0.2 / 0.35 / 0.5 / 0.75 across them (benchmarks/seed_table_study.py)."""
    return int(GRADES[np.searchsorted(GRADE_EDGES, smoothed(step), side="right")])


@dataclass
class Step:
    token: int
    order: int  # context length the prediction came from
    top: int  # times `token` followed that context
    total: int  # times the context was followed by anything


class NgramTable:
    def __init__(self, tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], tokens: int):
        self.tables = tables  # order -> (sorted keys u64, next token i32, top count i32, total count i32)
        self.tokens = tokens  # tokens the table was built from
        self.orders = tuple(sorted(tables, reverse=True))
        # every order's contexts in one sorted array (keys salted by order), so a lookup is one vectorised search
        salted = np.concatenate([tables[n][0] ^ _salt(n) for n in self.orders])
        pick = np.argsort(salted, kind="stable")
        self._keys = salted[pick]
        self._next, self._top, self._total = (np.concatenate([tables[n][j] for n in self.orders])[pick]
                                              for j in (1, 2, 3))
        self._order = np.concatenate([np.full(tables[n][0].size, n, dtype=np.int32) for n in self.orders])[pick]
        self._salts = [int(_salt(n)) for n in range(max(self.orders) + 1)]
        L = max(self.orders)
        self._powers = np.empty(L, dtype=np.uint64)  # M^(n-1) for n = 1..L: the batched suffix hashes' weights
        self._powers[0] = 1
        with np.errstate(over="ignore"):
            for n in range(1, L):
                self._powers[n] = self._powers[n - 1] * HASH_MUL
        self._salt_row = np.array(self._salts[1:], dtype=np.uint64)

    @classmethod
    def build(cls, sequences, orders=ORDERS, min_total: int = 1) -> "NgramTable":
        """sequences: iterables of token ids (one per output). Contexts never span two sequences."""
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
        seqs = [s for s in seqs if s.size >= 2]
        tables = {}
        for n in orders:
            keys, nexts = [], []
            for s in seqs:
                if s.size <= n:
                    continue
                keys.append(_hash_windows(s[:-1], n))  # context ending at i, followed by s[i + n]
                nexts.append(s[n:])
            if not keys:
                continue
            k = np.concatenate(keys)
            nx = np.concatenate(nexts).astype(np.int64)
            order = np.lexsort((nx, k))
            k, nx = k[order], nx[order]
            pair_start = np.flatnonzero(np.r_[True, (k[1:] != k[:-1]) | (nx[1:] != nx[:-1])])
            pair_count = np.diff(np.r_[pair_start, k.size])
            pk, pn = k[pair_start], nx[pair_start]
            key_start = np.flatnonzero(np.r_[True, pk[1:] != pk[:-1]])
            total = np.add.reduceat(pair_count, key_start)
            best = np.maximum.reduceat(pair_count, key_start)
            # the first pair of each key reaching its maximum count: the most frequent next token (ties: lowest id)
            seg = np.repeat(np.arange(key_start.size), np.diff(np.r_[key_start, pk.size]))
            is_best = pair_count == best[seg]
            first_best = np.flatnonzero(is_best)
            first_best = first_best[np.r_[True, seg[first_best][1:] != seg[first_best][:-1]]]
            keep = total >= min_total
            tables[n] = (pk[key_start][keep], pn[first_best][keep].astype(np.int32), best[keep].astype(np.int32),
                         total[keep].astype(np.int32))
        return cls(tables, int(sum(s.size for s in seqs)))

    def lookup(self, context) -> Step | None:
        """The longest-context prediction after `context` (a sequence of ids), or None."""
        ctx = [int(t) for t in context[-max(self.orders):]] if len(context) else []
        queries, h, mul = [], 0, 1
        for n in range(1, len(ctx) + 1):  # suffix hashes, shortest first: h_{n+1} = (t_{-n-1} + 1) M^n + h_n
            h = (h + (ctx[-n] + 1) * mul) & MASK64
            mul = (mul * HASH_MUL_INT) & MASK64
            queries.append(h ^ self._salts[n])
        if not queries:
            return None
        q = np.array(queries, dtype=np.uint64)
        idx = np.minimum(np.searchsorted(self._keys, q), self._keys.size - 1)
        hit = np.flatnonzero(self._keys[idx] == q)
        if hit.size == 0:
            return None
        i = int(idx[hit[-1]])  # the longest context found (orders not in the table never match)
        return Step(int(self._next[i]), int(self._order[i]), int(self._top[i]), int(self._total[i]))

    def chain(self, context, max_tokens: int) -> list[Step]:
        """Greedy chain of up to max_tokens predictions, each fed back as context for the next."""
        ctx = [int(t) for t in context[-max(self.orders):]]
        out = []
        for _ in range(max_tokens):
            step = self.lookup(ctx)
            if step is None:
                break
            out.append(step)
            ctx.append(step.token)
        return out

    def candidate(self, context, max_tokens: int, source: int) -> Candidate | None:
        """The table's chain as a retrieval proposal, each draft with its own evidence (order, grade), cut before
        the first draft whose smoothed frequency is below MIN_SMOOTHED (those are accepted ~5% of the time)."""
        return self.candidates([context], max_tokens, source)[0]

    def candidates(self, contexts, max_tokens: int, source: int) -> list[Candidate | None]:
        """candidate() for a batch of contexts at once: every request's chain advances one draft per vectorised
        search (the walk of chain(), for all rows together), so a step of a thousand requests costs milliseconds."""
        R, L = len(contexts), max(self.orders)
        if R == 0 or max_tokens <= 0:
            return [None] * R
        tails = np.zeros((R, L), dtype=np.int64)
        lens = np.zeros(R, dtype=np.int64)
        for r, ctx in enumerate(contexts):
            t = np.asarray(ctx[-L:], dtype=np.int64)
            tails[r, L - t.size:] = t
            lens[r] = t.size
        width = np.arange(1, L + 1)
        out_tok = np.zeros((R, max_tokens), dtype=np.int64)
        out_order = np.zeros((R, max_tokens), dtype=np.int64)
        out_grade = np.zeros((R, max_tokens), dtype=np.int64)
        length = np.zeros(R, dtype=np.int64)
        alive = lens > 0
        for k in range(max_tokens):
            if not alive.any():
                break
            with np.errstate(over="ignore"):
                # column n - 1: hash of the last n tokens (the tail's last column is its newest token)
                terms = (tails[:, ::-1].astype(np.uint64) + np.uint64(1)) * self._powers
                q = np.cumsum(terms, axis=1, dtype=np.uint64) ^ self._salt_row
            idx = np.minimum(np.searchsorted(self._keys, q.ravel()), self._keys.size - 1).reshape(R, L)
            hit = (self._keys[idx] == q) & (width <= lens[:, None])
            best = L - 1 - np.argmax(hit[:, ::-1], axis=1)  # the longest context found
            found = hit[np.arange(R), best] & alive
            at = idx[np.arange(R), best]
            top, total = self._top[at].astype(np.float64), self._total[at].astype(np.float64)
            sm = top / (total + 1)
            ok = found & (sm >= MIN_SMOOTHED)
            out_tok[ok, k] = self._next[at[ok]]
            out_order[ok, k] = self._order[at[ok]]
            out_grade[ok, k] = GRADES[np.searchsorted(GRADE_EDGES, sm[ok], side="right")]
            length[ok] += 1
            alive = ok
            tails = np.concatenate([tails[:, 1:], out_tok[:, k: k + 1]], axis=1)
            lens = np.minimum(lens + 1, L)
        out: list[Candidate | None] = []
        for r in range(R):
            n = int(length[r])
            out.append(Candidate(tokens=out_tok[r, :n].copy(), match_len=int(out_order[r, 0]),
                                 count=int(out_grade[r, 0]), source=source, match_lens=out_order[r, :n].copy(),
                                 counts=out_grade[r, :n].copy()) if n else None)
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path) -> None:
        arrays = {"version": np.array([FORMAT_VERSION]), "tokens": np.array([self.tokens])}
        for n, (k, nx, top, total) in self.tables.items():
            arrays.update({f"keys_{n}": k, f"next_{n}": nx, f"top_{n}": top, f"total_{n}": total})
        np.savez_compressed(path, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "NgramTable":
        """Raises ValueError naming what is wrong with a malformed file."""
        try:
            data = np.load(path)
        except Exception as e:
            raise ValueError(f"n-gram table {path}: unreadable ({type(e).__name__}: {e})") from e
        if "version" not in data or int(data["version"][0]) != FORMAT_VERSION:
            raise ValueError(f"n-gram table {path}: unsupported or missing version")
        tables = {}
        for name in data.files:
            if not name.startswith("keys_"):
                continue
            n = int(name[5:])
            parts = [data[f"{p}_{n}"] for p in ("keys", "next", "top", "total")]
            if len({p.shape for p in parts}) != 1 or parts[0].dtype != np.uint64 or \
                    (parts[0][1:] <= parts[0][:-1]).any():
                raise ValueError(f"n-gram table {path}: order {n} arrays are inconsistent")
            tables[n] = tuple(parts)
        if not tables:
            raise ValueError(f"n-gram table {path}: no orders")
        return cls(tables, int(data["tokens"][0]))
