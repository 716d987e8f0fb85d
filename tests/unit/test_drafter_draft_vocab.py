"""Reduced draft vocabulary: which ids it keeps, that proposing over it equals proposing over the full vocabulary with
every other id masked out, the dense q it hands the verifier, and strict loading of its file."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from sglang_dspark.drafter import (DraftVocabError, build_draft_vocab, load_draft_vocab, load_drafter,
                                   save_draft_vocab, save_drafter)
from sglang_dspark.drafter.draft_vocab import DRAFT_VOCAB_NAME, coverage
from sglang_dspark.train.vocab import count_tokens

from tests.unit.test_drafter_model import V, context, make_model

pytestmark = pytest.mark.usefixtures("single_thread")


def test_build_keeps_most_frequent_then_lowest_ids_and_forced():
    counts = torch.zeros(10, dtype=torch.int64)
    counts[7], counts[3], counts[5] = 50, 20, 20
    ids = build_draft_vocab(counts, 4, always=(9,))
    # 9 forced; 7 (50); 3 and 5 tie at 20 -> both fit before any uncounted id
    assert ids.tolist() == [3, 5, 7, 9]
    assert build_draft_vocab(counts, 5).tolist() == [0, 1, 3, 5, 7]  # counted ids, then the lowest uncounted
    assert build_draft_vocab(counts, 100).tolist() == list(range(10))
    assert coverage(torch.tensor([7]), counts) == pytest.approx(50 / 90)


def _masked_reference(model, anchor, pos, k, v, valid, vocab):
    """The full-vocabulary torch loop with every id outside `vocab` at -inf (greedy)."""
    h = model.backbone(*model.block_inputs(anchor, pos), k, v, valid)
    outside = torch.ones(model.config.vocab_size, dtype=torch.bool)
    outside[vocab] = False
    prev, toks, logits = anchor.long(), [], []
    for j in range(model.block_size):
        lk = model.lm_head(h[:, j]).float() + model.markov_head.step(h[:, j], prev)[0].float()
        lk = lk.masked_fill(outside, float("-inf"))
        prev = lk.argmax(-1)
        toks.append(prev)
        logits.append(lk)
    return torch.stack(toks, 1), torch.stack(logits, 1)


@torch.no_grad()
def test_greedy_propose_over_draft_vocab_equals_masked_full_vocab():
    model = make_model()
    _, k, v = context(model)
    k, v = k.expand(-1, 3, -1, -1, -1), v.expand(-1, 3, -1, -1, -1)
    valid = torch.ones(3, 10, dtype=torch.bool)
    anchor, pos = torch.tensor([4, 11, 30]), torch.tensor([10, 10, 10])
    vocab = torch.tensor(sorted(set(range(0, V, 3)) | {4, 11}))
    ref_tokens, ref_logits = _masked_reference(model, anchor, pos, k, v, valid, vocab)
    full = model.propose(anchor, pos, k, v, valid, torch.zeros(3))
    model.set_draft_vocab(vocab)
    got = model.propose(anchor, pos, k, v, valid, torch.zeros(3))
    assert torch.equal(got.tokens, ref_tokens)
    assert not torch.equal(full.tokens, ref_tokens)  # the restriction actually changed something here
    assert got.logits.shape == (3, model.block_size, len(vocab))
    dense = got.dense_logits(V)
    assert torch.equal(torch.isinf(dense), torch.isinf(ref_logits))
    assert torch.allclose(dense[torch.isfinite(dense)], ref_logits[torch.isfinite(ref_logits)], atol=1e-5)
    assert torch.allclose(got.conf_logits, model.confidence_logits(
        model.backbone(*model.block_inputs(anchor, pos), k, v, valid),
        torch.cat([anchor[:, None], ref_tokens[:, :-1]], 1)), atol=1e-5)
    model.set_draft_vocab(None)
    assert torch.equal(model.propose(anchor, pos, k, v, valid, torch.zeros(3)).tokens, full.tokens)


@torch.no_grad()
def test_sampled_drafts_stay_inside_the_draft_vocab_and_q_is_zero_outside():
    model = make_model()
    _, k, v = context(model)
    vocab = torch.tensor([1, 2, 3, 5, 8, 13, 21, 34])
    model.set_draft_vocab(vocab)
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(50):
        p = model.propose(torch.tensor([4]), torch.tensor([10]), k, v, torch.ones(1, 10, dtype=torch.bool),
                          torch.tensor([2.0]), g)
        seen |= set(p.tokens.flatten().tolist())
        q = torch.softmax(p.dense_logits(V) / 2.0, -1)
        outside = torch.ones(V, dtype=torch.bool)
        outside[vocab] = False
        assert float(q[..., outside].sum()) == 0.0
        assert torch.allclose(q.sum(-1), torch.ones(1, model.block_size))
    assert seen <= set(vocab.tolist()) and len(seen) > 3


def test_load_drafter_applies_the_file_and_can_skip_it(tmp_path):
    model = make_model()
    save_drafter(model, tmp_path, include_shared=True, dtype=torch.float32)
    vocab = torch.arange(0, V, 2)
    save_draft_vocab(str(tmp_path / DRAFT_VOCAB_NAME), vocab, 0.9)
    loaded = load_drafter(tmp_path, dtype=torch.float32)
    assert torch.equal(loaded.draft_vocab, vocab)
    assert load_drafter(tmp_path, dtype=torch.float32, draft_vocab=False).draft_vocab is None


@pytest.mark.parametrize("tensors, match", [
    ({"ids": torch.arange(4)}, "no tensor 'token_ids'"),
    ({"token_ids": torch.tensor([3, 1, 2])}, "sorted and unique"),
    ({"token_ids": torch.tensor([1, 1, 2])}, "sorted and unique"),
    ({"token_ids": torch.tensor([0, V])}, "outside"),
    ({"token_ids": torch.tensor([0.0, 1.0])}, "integer"),
])
def test_malformed_draft_vocab_fails_with_the_reason(tmp_path, tensors, match):
    path = str(tmp_path / DRAFT_VOCAB_NAME)
    save_file(tensors, path)
    with pytest.raises(DraftVocabError, match=match):
        load_draft_vocab(path, V)


def test_truncated_draft_vocab_file_fails_clearly(tmp_path):
    path = tmp_path / DRAFT_VOCAB_NAME
    path.write_bytes(b"\x10\x00\x00")
    with pytest.raises(DraftVocabError, match="not a readable safetensors"):
        load_draft_vocab(str(path), V)


class _CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) - ord("a") for c in text]


def test_count_tokens_counts_only_assistant_turns(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "zzzz"}, {"role": "assistant", "content": "abca"}]},
            {"messages": [{"role": "assistant", "content": "b"}]}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    counts = count_tokens([str(path)], _CharTokenizer(), 26)
    assert counts[:3].tolist() == [2, 2, 1] and int(counts.sum()) == 5
    assert os.path.exists(path)
