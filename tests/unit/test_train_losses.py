"""Losses against a naive per-element reimplementation; anchors; target logits indexing."""

import math

import pytest
import torch

from sglang_dspark.drafter import block_labels, sample_anchors
from sglang_dspark.train.fit import lr_lambda_for
from sglang_dspark.train.losses import dspark_losses, target_block_logits


def naive_losses(dl, tl, cl, labels, mask, gamma=4.0):
    b, N, B, V = dl.shape
    ce = l1 = conf = wsum = 0.0
    for i in range(b):
        for j in range(N):
            for k in range(B):
                if not mask[i, j, k]:
                    continue
                w = math.exp(-k / gamma)
                pd = torch.softmax(dl[i, j, k].double(), -1)
                pt = torch.softmax(tl[i, j, k].double(), -1)
                ce += w * -math.log(pd[labels[i, j, k]])
                dist = float((pd - pt).abs().sum())
                l1 += w * dist
                c = min(max(1 - 0.5 * dist, 0.0), 1.0)
                s = 1 / (1 + math.exp(-float(cl[i, j, k])))
                conf += w * -(c * math.log(s) + (1 - c) * math.log(1 - s))
                wsum += w
    return ce / wsum, l1 / wsum, conf / wsum


def test_losses_match_naive_reimplementation():
    g = torch.Generator().manual_seed(0)
    b, N, B, V = 2, 3, 4, 11
    dl, tl = torch.randn(b, N, B, V, generator=g) * 2, torch.randn(b, N, B, V, generator=g) * 2
    cl, labels = torch.randn(b, N, B, generator=g), torch.randint(0, V, (b, N, B), generator=g)
    mask = torch.rand(b, N, B, generator=g) < 0.7
    loss, st = dspark_losses(dl, tl, cl, labels, mask)
    ce, l1, conf = naive_losses(dl, tl, cl, labels, mask)
    assert st["ce"] == pytest.approx(ce, rel=1e-5) and st["l1"] == pytest.approx(l1, rel=1e-5)
    assert st["conf"] == pytest.approx(conf, rel=1e-5)
    assert float(loss) == pytest.approx(0.1 * ce + 0.9 * l1 + 1.0 * conf, rel=1e-5)
    # the soft confidence label is detached: no gradient flows from Conf into the draft logits
    dl2 = dl.clone().requires_grad_(True)
    dspark_losses(dl2, tl, cl, labels, mask, ce_weight=0.0, l1_weight=0.0)[0].backward()
    assert dl2.grad is None or float(dl2.grad.abs().sum()) == 0.0


def test_external_denominator_for_accumulation():
    g = torch.Generator().manual_seed(1)
    dl, tl = torch.randn(1, 2, 3, 7, generator=g), torch.randn(1, 2, 3, 7, generator=g)
    cl, labels, mask = torch.randn(1, 2, 3, generator=g), torch.randint(0, 7, (1, 2, 3), generator=g), \
        torch.ones(1, 2, 3, dtype=torch.bool)
    full, st = dspark_losses(dl, tl, cl, labels, mask)
    half, _ = dspark_losses(dl, tl, cl, labels, mask, denom=2 * st["weight"])
    assert float(half) == pytest.approx(float(full) / 2, rel=1e-6)


def test_target_block_logits_index_anchor_plus_k():
    lm_head = torch.nn.Linear(4, 9, bias=False)
    last = torch.randn(1, 10, 4)
    anchors = torch.tensor([[2, 8]])
    out = target_block_logits(lm_head, last, anchors, 3)
    assert out.shape == (1, 2, 3, 9)
    assert torch.allclose(out[0, 0, 2], lm_head(last[0, 4]))
    assert torch.allclose(out[0, 1, 2], lm_head(last[0, 9]))  # 8+2=10 clamped to S-1


def test_anchor_sampling_respects_loss_mask_and_keep():
    g = torch.Generator().manual_seed(0)
    lm = (torch.rand(3, 40, generator=g) < 0.6).long()
    anchors, keep = sample_anchors(lm, 12, torch.Generator().manual_seed(1))
    for r in range(3):
        a = anchors[r][keep[r]]
        assert all(lm[r, i] and lm[r, i + 1] for i in a.tolist())
        n_cand = int((lm[r, :-1] * lm[r, 1:]).sum())
        assert len(a) == min(12, n_cand) and (a.diff() > 0).all()
        assert (anchors[r][~keep[r]] == 0).all()
    ids = torch.arange(40)[None].expand(3, 40)
    labels, emask = block_labels(ids, lm, anchors, keep, 4)
    assert not emask[~keep].any()
    assert torch.equal(labels[keep][:, 0], anchors[keep] + 1)
    # supervised labels are loss tokens, and the valid part is a prefix
    pos = anchors[..., None] + torch.arange(1, 5)
    for r in range(3):
        assert bool(lm[r][pos[r][emask[r]]].all())
    assert (emask.long().diff(dim=-1) <= 0).all()


def test_lr_schedule_warmup_then_cosine_to_zero():
    f = lr_lambda_for(100, 4)
    assert f(0) == pytest.approx(0.25) and f(3) == pytest.approx(1.0)
    assert f(4) == pytest.approx(1.0) and f(52) == pytest.approx(0.5) and f(100) == pytest.approx(0.0)


def test_sampled_vocabulary_losses():
    """Over the whole vocabulary the sampled path equals the full one; over a subset CE renormalises over it and
    L1 adds the target mass left outside."""
    from sglang_dspark.train.losses import candidate_vocab

    g = torch.Generator().manual_seed(1)
    b, N, B, V = 1, 2, 3, 9
    dl, tl = torch.randn(b, N, B, V, generator=g), torch.randn(b, N, B, V, generator=g)
    cl, labels = torch.randn(b, N, B, generator=g), torch.randint(0, V, (b, N, B), generator=g)
    mask = torch.ones(b, N, B, dtype=torch.bool)
    full, st_full = dspark_losses(dl, tl, cl, labels, mask)
    every = torch.arange(V)
    same, st_same = dspark_losses(dl, tl, cl, labels, mask, vocab=every)
    torch.testing.assert_close(same, full)
    vocab = candidate_vocab(tl, labels, top_k=2, negatives=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(vocab, torch.unique(vocab)) and set(labels.flatten().tolist()) <= set(vocab.tolist())
    assert set(tl.topk(2, -1).indices.flatten().tolist()) <= set(vocab.tolist())
    _, st = dspark_losses(dl[..., vocab], tl, cl, labels, mask, vocab=vocab)
    pd = torch.softmax(dl[0, 0, 0, vocab].double(), -1)
    pt = torch.softmax(tl[0, 0, 0].double(), -1)
    inside = (pd - pt[vocab]).abs().sum() + (1 - pt[vocab].sum())
    ce0 = -math.log(pd[(vocab == labels[0, 0, 0]).nonzero().item()])
    # position 0 carries weight 1; check one cell by recomputing the loss on a mask holding only it
    one = torch.zeros_like(mask)
    one[0, 0, 0] = True
    _, st_one = dspark_losses(dl[..., vocab], tl, cl, labels, one, vocab=vocab)
    assert st_one["ce"] == pytest.approx(ce0, rel=1e-5)
    assert st_one["l1"] == pytest.approx(float(inside), rel=1e-5)
    assert st["l1"] >= 0
