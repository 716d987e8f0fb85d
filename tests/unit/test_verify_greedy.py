import torch

from sglang_dspark.verify import accept_greedy


def _long(rows):
    return torch.tensor(rows, dtype=torch.long)


def test_greedy_hand_cases():
    drafts = _long([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7], [1, 2, 3]])
    target = _long([[5, 6, 9, 4], [5, 6, 7, 8], [5, 6, 7, 8], [9, 6, 7, 8], [1, 2, 3, 4]])
    verify_lens = _long([3, 3, 0, 3, 2])
    res = accept_greedy(drafts, verify_lens, target)
    # row0: mismatch at 2 -> accept 2, bonus target[2]=9; row1: all 3 accepted, bonus target[3]=8
    # row2: verify 0 -> plain decode, bonus target[0]; row3: first draft wrong; row4: verify cap 2 stops a full match
    assert res.accept_lens.tolist() == [2, 3, 0, 0, 2]
    assert res.bonus_tokens.tolist() == [9, 8, 5, 9, 3]
    assert res.num_output.tolist() == [3, 4, 1, 1, 3]
    assert res.output_tokens.tolist() == [
        [5, 6, 9, -1],
        [5, 6, 7, 8],
        [5, -1, -1, -1],
        [9, -1, -1, -1],
        [1, 2, 3, -1],
    ]


def test_greedy_match_after_mismatch_is_not_accepted():
    res = accept_greedy(_long([[1, 2, 3]]), _long([3]), _long([[1, 0, 3, 4]]))
    assert res.accept_lens.tolist() == [1]
    assert res.bonus_tokens.tolist() == [0]


def test_greedy_vectorised_matches_loop():
    g = torch.Generator().manual_seed(0)
    R, G = 64, 7
    drafts = torch.randint(0, 3, (R, G), generator=g)
    target = torch.randint(0, 3, (R, G + 1), generator=g)
    verify_lens = torch.randint(0, G + 1, (R,), generator=g)
    res = accept_greedy(drafts, verify_lens, target)
    for r in range(R):
        a = 0
        while a < verify_lens[r] and drafts[r, a] == target[r, a]:
            a += 1
        assert res.accept_lens[r] == a
        assert res.bonus_tokens[r] == target[r, a]
        assert res.output_tokens[r, : a + 1].tolist() == drafts[r, :a].tolist() + [target[r, a].item()]
        assert (res.output_tokens[r, a + 1 :] == -1).all()
