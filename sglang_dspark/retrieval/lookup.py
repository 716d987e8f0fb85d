"""Prompt/output lookup: the tokens that followed an earlier occurrence of the context's longest repeated suffix
(prompt lookup decoding over the whole prompt and output so far, not a window of it: an edited function deep in
the prompt is found as well as a phrase the answer repeats)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Candidate:
    """One retrieval proposal: a chain of tokens to verify after the request's last committed token."""
    tokens: np.ndarray  # Long[n]
    match_len: int  # tokens of context the chain was matched on (the corpus: the chain length, its proxy)
    count: int  # earlier occurrences of that suffix in the context (the evidence behind the continuation; the n-gram
    #             table: the evidence grade of its next-token frequency, ngram_table.grade)
    source: int  # stats.SOURCE_* of the plugin: 1 prompt lookup, 2 cross-request corpus, 3 n-gram table
    history: int = 0  # confidence.HISTORY_*: how the request's last verified chain of this source ended
    # per position, where each draft has evidence of its own (the n-gram table): its match length and count
    match_lens: np.ndarray | None = None
    counts: np.ndarray | None = None


def _longest_repeat(ctx: np.ndarray, max_ngram: int, min_ngram: int) -> tuple[int, np.ndarray]:
    """(n, start positions of the earlier occurrences) for the longest n-token suffix that occurs earlier."""
    L = ctx.size
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        suffix = ctx[L - n:]
        starts = np.flatnonzero(ctx[: L - n] == suffix[0])  # the occurrence must end before the suffix starts
        starts = starts[starts + n <= L - 1]
        if starts.size == 0:
            continue
        win = ctx[starts[:, None] + np.arange(n)[None, :]]  # windows [s, s + n) compared at once
        hit = np.flatnonzero((win == suffix[None, :]).all(1))
        if hit.size:
            return n, starts[hit]
    return 0, ctx[:0]


def suffix_continuation(context: np.ndarray, max_tokens: int, max_ngram: int = 8,
                        min_ngram: int = 2) -> tuple[np.ndarray, int]:
    """(continuation, match length): for the longest n in [min_ngram, max_ngram] whose last-n-token suffix of
    `context` occurs earlier in it, the up to `max_tokens` tokens that followed its most recent earlier occurrence.
    An empty continuation and 0 when no suffix of min_ngram tokens repeats."""
    ctx = np.asarray(context, dtype=np.int64)
    if max_tokens <= 0 or ctx.size <= min_ngram:
        return ctx[:0], 0
    n, starts = _longest_repeat(ctx, max_ngram, min_ngram)
    if not n:
        return ctx[:0], 0
    s = int(starts[-1]) + n  # most recent match wins
    return ctx[s: s + max_tokens], n


def prompt_candidate(context: np.ndarray, max_tokens: int, source: int, max_ngram: int = 8,
                     min_ngram: int = 2) -> Candidate | None:
    """suffix_continuation with its evidence: match length and how many earlier occurrences the suffix has."""
    ctx = np.asarray(context, dtype=np.int64)
    if max_tokens <= 0 or ctx.size <= min_ngram:
        return None
    n, starts = _longest_repeat(ctx, max_ngram, min_ngram)
    if not n:
        return None
    s = int(starts[-1]) + n
    tokens = ctx[s: s + max_tokens]
    if tokens.size == 0:
        return None
    return Candidate(tokens=tokens, match_len=n, count=int(starts.size), source=source)
