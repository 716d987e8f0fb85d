"""The n-gram table of the target's answers (retrieval/ngram_table.py): counts against a brute-force count, chains,
per-position evidence and its confidence cells, the file format and its errors, the server's table setting."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from sglang_dspark.retrieval import NgramTable, RetrievalConfidence
from sglang_dspark.retrieval.ngram_table import MIN_SMOOTHED, grade, smoothed


def _brute(seqs, n):
    follow: dict[tuple, Counter] = {}
    for s in seqs:
        for i in range(len(s) - n):
            follow.setdefault(tuple(s[i: i + n]), Counter())[s[i + n]] += 1
    return follow


def test_lookup_matches_a_brute_force_count_at_every_order():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 6, size=rng.integers(2, 60)).tolist() for _ in range(40)]
    table = NgramTable.build(seqs, orders=(1, 2, 3))
    for n in (3, 2, 1):
        for ctx, counts in _brute(seqs, n).items():
            longer = [m for m in (3, 2) if m > n]
            step = table.lookup(list(ctx))
            if longer:  # a longer context of the same tail may exist; check the order-n table directly instead
                step = NgramTable({n: table.tables[n]}, table.tokens).lookup(list(ctx))
            top = max(counts.values())
            assert step.order == n and step.total == sum(counts.values()) and step.top == top
            assert step.token == min(t for t, c in counts.items() if c == top)  # ties: the lowest id


def test_contexts_do_not_span_sequences_and_longest_order_wins():
    table = NgramTable.build([[1, 2, 3], [4, 5]], orders=(1, 2))
    assert table.lookup([3]) is None  # 3 ended a sequence: nothing followed it
    assert table.lookup([3, 4]).order == 1  # (3, 4) spans the two sequences: only the order-1 context 4 is known
    assert table.lookup([1, 2]) .order == 2 and table.lookup([1, 2]).token == 3
    assert [s.token for s in table.chain([1], 5)] == [2, 3]  # each prediction is fed back


def test_candidate_cuts_weak_drafts_and_carries_per_position_evidence():
    seqs = [[1, 2, 3]] * 20 + [[3, 7], [3, 8], [3, 9], [3, 10], [3, 11]]
    table = NgramTable.build(seqs, orders=(1,))
    cand = table.candidate([1], 7, source=3)
    # 1 -> 2 -> 3 are certain; after 3 the next token is a 1-in-5 guess, below MIN_SMOOTHED: the chain stops there
    assert cand.tokens.tolist() == [2, 3]
    step3 = table.lookup([3])
    assert smoothed(step3) < MIN_SMOOTHED
    assert cand.match_lens.tolist() == [1, 1] and cand.counts.tolist() == [8, 8]
    assert grade(table.lookup([1])) == 8 and cand.count == 8 and cand.match_len == 1
    assert table.candidate([3], 7, source=3) is None


def test_confidence_uses_and_refines_each_positions_own_cell():
    conf = RetrievalConfidence(3)
    strong = conf.probs("table", 1, 8, 1)[0]
    weak = conf.probs("table", 1, 1, 1)[0]
    assert strong > weak  # the built-in prior follows the evidence grade
    p = conf.probs("table", 1, 8, 2, match_lens=np.array([1, 1]), counts=np.array([8, 1]))
    assert p[0] == pytest.approx(strong) and p[1] == pytest.approx(conf.probs("table", 1, 1, 2)[1])
    before = conf.table["table"].copy()
    conf.observe("table", 1, 8, p, 2, 1, match_lens=np.array([1, 1]), counts=np.array([8, 1]))
    diff = conf.table["table"] - before
    m = 0  # match bucket of length 1
    assert diff[m, 3, 0, 0, 0] == 1 and diff[m, 0, 0, 1, 1] == 1  # accepted at 0 (grade 8), rejected at 1 (grade 1)
    assert np.abs(diff).sum() == 2


def test_save_load_round_trip_and_malformed_files(tmp_path):
    table = NgramTable.build([[1, 2, 3, 1, 2, 4]])
    table.save(tmp_path / "t.npz")
    back = NgramTable.load(tmp_path / "t.npz")
    assert back.tokens == table.tokens and back.lookup([1, 2]) == table.lookup([1, 2])
    (tmp_path / "junk.npz").write_bytes(b"not a table")
    with pytest.raises(ValueError, match="unreadable"):
        NgramTable.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "nover.npz", keys_1=np.array([1], dtype=np.uint64))
    with pytest.raises(ValueError, match="version"):
        NgramTable.load(tmp_path / "nover.npz")
    bad = {"version": np.array([1]), "tokens": np.array([3]), "keys_1": np.array([5, 2], dtype=np.uint64),
           "next_1": np.array([1, 1], dtype=np.int32), "top_1": np.array([1, 1], dtype=np.int32),
           "total_1": np.array([1, 1], dtype=np.int32)}
    np.savez(tmp_path / "unsorted.npz", **bad)
    with pytest.raises(ValueError, match="inconsistent"):
        NgramTable.load(tmp_path / "unsorted.npz")


def test_server_table_setting(tmp_path):
    from sglang_dspark.sglang_plugin.retrieval_drafts import TABLE_FILE, load_ngram_table

    assert load_ngram_table("off", str(tmp_path)) is None
    assert load_ngram_table("auto", str(tmp_path)) is None  # the drafter ships none: no table, no error
    with pytest.raises(ValueError, match="no such file"):
        load_ngram_table(str(tmp_path / "missing.npz"), None)
    (tmp_path / TABLE_FILE).write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable"):
        load_ngram_table("auto", str(tmp_path))
    NgramTable.build([[1, 2, 3]]).save(tmp_path / TABLE_FILE)
    assert load_ngram_table("auto", str(tmp_path)).lookup([1]).token == 2


def test_batched_candidates_equal_one_at_a_time_walks():
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 5, size=rng.integers(3, 40)).tolist() for _ in range(60)]
    table = NgramTable.build(seqs)
    contexts = [rng.integers(0, 5, size=rng.integers(1, 20)) for _ in range(200)] + [np.zeros(0, dtype=np.int64)]
    batched = table.candidates(contexts, 7, source=3)
    for ctx, got in zip(contexts, batched):
        steps = []
        for step in table.chain(ctx, 7):  # the reference walk: back-off lookups, cut at the first weak draft
            if smoothed(step) < MIN_SMOOTHED:
                break
            steps.append(step)
        if not steps:
            assert got is None
            continue
        assert got.tokens.tolist() == [s.token for s in steps]
        assert got.match_lens.tolist() == [s.order for s in steps]
        assert got.counts.tolist() == [grade(s) for s in steps]
