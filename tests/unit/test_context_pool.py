"""Deferred drafter-context writes: what a gather reads equals immediate writes, in write order."""

import pytest
import torch

from sglang_dspark.sglang_plugin import context_pool as cp
from sglang_dspark.sglang_plugin.context_pool import DraftContextPool
from tests.unit.test_drafter_model import D, M, make_model

pytestmark = pytest.mark.usefixtures("single_thread")

SLOTS = 40


def feats(n, seed):
    return torch.randn(n, M * D, generator=torch.Generator().manual_seed(seed))


def writes():
    """Three steps' writes; the third rewrites slots 5 and 7 (a freed slot reused / a rejected verify slot)."""
    return [(torch.tensor([3, 5, 7]), torch.tensor([0, 1, 2]), feats(3, 1)),
            (torch.tensor([9, 11]), torch.tensor([4, 9]), feats(2, 2)),
            (torch.tensor([7, 12, 5]), torch.tensor([6, 3, 8]), feats(3, 3))]


def test_deferred_writes_read_like_immediate_ones():
    model = make_model()
    now, later = (DraftContextPool(model, SLOTS, torch.device("cpu"), torch.float32) for _ in range(2))
    for w in writes():
        now.write(*w)
        later.defer(*w)
    assert later.pending_tokens == 8
    assert not torch.equal(now.k, later.k)  # nothing applied yet
    r2t = torch.tensor([[3, 5, 7, 9, 11, 12], [12, 7, 0, 0, 0, 0]])
    lens = torch.tensor([6, 2])
    a, b = now.gather(r2t, torch.tensor([0, 1]), lens), later.gather(r2t, torch.tensor([0, 1]), lens)
    assert later.pending_tokens == 0
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    # the last write to slot 7 won: its K is the one computed at position 6 from the third step's features
    k_last, _ = model.context_kv(model.project_context(feats(3, 3)[:1]), torch.tensor([6]))
    torch.testing.assert_close(later.k[:, 7], k_last[:, 0], rtol=1e-5, atol=1e-6)


def test_immediate_write_applies_older_deferred_ones_first():
    """A prefill writes at once; a deferred decode write to the same slot from before must not land after it."""
    model = make_model()
    pool = DraftContextPool(model, SLOTS, torch.device("cpu"), torch.float32)
    pool.defer(torch.tensor([4]), torch.tensor([0]), feats(1, 5))
    pool.write(torch.tensor([4]), torch.tensor([2]), feats(1, 6))
    k, _ = model.context_kv(model.project_context(feats(1, 6)), torch.tensor([2]))
    torch.testing.assert_close(pool.k[:, 4], k[:, 0], rtol=1e-5, atol=1e-6)


def test_pending_features_are_copied_and_bounded(monkeypatch):
    model = make_model()
    pool = DraftContextPool(model, SLOTS, torch.device("cpu"), torch.float32)
    f = feats(2, 7)
    expected, _ = model.context_kv(model.project_context(f), torch.tensor([0, 1]))
    pool.defer(torch.tensor([1, 2]), torch.tensor([0, 1]), f)
    f.zero_()  # the caller's buffer is reused (CUDA graph output) before the flush
    pool.flush()
    torch.testing.assert_close(pool.k[:, 1:3], expected, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(cp, "MAX_PENDING_TOKENS", 4)
    pool.defer(torch.tensor([1, 2]), torch.tensor([0, 1]), feats(2, 8))
    assert pool.pending_tokens == 2
    pool.defer(torch.tensor([3, 4]), torch.tensor([2, 3]), feats(2, 9))
    assert pool.pending_tokens == 0  # flushed at the bound
