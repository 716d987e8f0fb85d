"""Prompt/output lookup (retrieval.suffix_continuation) against a brute-force reference."""

import numpy as np

from sglang_dspark.retrieval import suffix_continuation


def _reference(ctx: list[int], k: int, max_n: int = 8, min_n: int = 2):
    L = len(ctx)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        suffix = ctx[L - n:]
        for s in range(L - n - 1, -1, -1):  # most recent earlier occurrence ending before the suffix starts... or not
            if s + n <= L - 1 and ctx[s:s + n] == suffix:
                return ctx[s + n:s + n + k], n
    return [], 0


def test_longest_most_recent_match_continues():
    cont, n = suffix_continuation(np.array([1, 2, 3, 4, 5, 1, 2, 3, 7, 1, 2, 3]), 3)
    assert n == 3 and cont.tolist() == [7, 1, 2]


def test_no_repeat_gives_nothing():
    cont, n = suffix_continuation(np.array([1, 2, 3, 4]), 4)
    assert n == 0 and cont.size == 0
    assert suffix_continuation(np.array([5]), 4)[1] == 0
    assert suffix_continuation(np.array([1, 2, 1, 2]), 0)[1] == 0


def test_matches_the_brute_force_reference_on_random_contexts():
    rng = np.random.default_rng(0)
    for _ in range(300):
        ctx = rng.integers(0, 4, size=int(rng.integers(1, 40))).tolist()
        k = int(rng.integers(1, 6))
        cont, n = suffix_continuation(np.array(ctx), k)
        ref, ref_n = _reference(ctx, k)
        assert (cont.tolist(), n) == (ref, ref_n), ctx


def test_prompt_candidate_carries_match_length_and_occurrence_count():
    from sglang_dspark.retrieval import prompt_candidate

    ctx = np.array([9, 1, 2, 5, 1, 2, 6, 1, 2])
    cand = prompt_candidate(ctx, 4, source=1)
    assert cand.match_len == 2 and cand.count == 2 and cand.tokens.tolist() == [6, 1, 2]
    assert cand.source == 1
    assert prompt_candidate(np.array([1, 2, 3]), 4, source=1) is None
    # agrees with suffix_continuation on random contexts
    rng = np.random.default_rng(1)
    for _ in range(200):
        ctx = rng.integers(0, 4, size=int(rng.integers(3, 40)))
        cont, n = suffix_continuation(ctx, 5)
        cand = prompt_candidate(ctx, 5, source=1)
        if cand is None:
            assert n == 0 or cont.size == 0
        else:
            assert (cand.match_len, cand.tokens.tolist()) == (n, cont.tolist())
            s = ctx[ctx.size - n:]
            brute = sum(1 for i in range(ctx.size - n) if (ctx[i:i + n] == s).all() and i + n <= ctx.size - 1)
            assert cand.count == brute
