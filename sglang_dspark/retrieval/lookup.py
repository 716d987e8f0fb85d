"""Prompt/output lookup: the tokens that followed the most recent earlier occurrence of the context's longest
suffix (prompt lookup decoding, over the whole prompt and output so far, not a window of it)."""

from __future__ import annotations

import numpy as np


def suffix_continuation(context: np.ndarray, max_tokens: int, max_ngram: int = 8,
                        min_ngram: int = 2) -> tuple[np.ndarray, int]:
    """(continuation, match length): for the longest n in [min_ngram, max_ngram] whose last-n-token suffix of
    `context` occurs earlier in it, the up to `max_tokens` tokens that followed its most recent earlier occurrence.
    An empty continuation and 0 when no suffix of min_ngram tokens repeats."""
    ctx = np.asarray(context, dtype=np.int64)
    L = ctx.size
    if max_tokens <= 0 or L <= min_ngram:
        return ctx[:0], 0
    # candidate starts: earlier positions whose token equals the suffix's first token, for each n from long to short
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        suffix = ctx[L - n:]
        starts = np.flatnonzero(ctx[: L - n] == suffix[0])  # occurrence must end before the suffix itself starts
        starts = starts[starts + n <= L - 1]
        if starts.size == 0:
            continue
        # windows [s, s + n) compared at once; most recent match wins
        win = ctx[starts[:, None] + np.arange(n)[None, :]]
        hit = np.flatnonzero((win == suffix[None, :]).all(1))
        if hit.size:
            s = int(starts[hit[-1]]) + n
            return ctx[s: s + max_tokens], n
    return ctx[:0], 0
