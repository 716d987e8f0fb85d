"""Grammar walks along drafts (sglang_plugin/grammar.py) with SGLang's real xgrammar backend on the tiny tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sglang_dspark.sglang_plugin.grammar import (FORCED_CONF_LOGIT, allowed_ids, mask_verify_rows, walk_drafts)

G = 4


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tests.tiny_model import build_tiny_model
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", arch="qwen2")
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def backend(tokenizer):
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    return XGrammarGrammarBackend(tokenizer, vocab_size=len(tokenizer),
                                  model_eos_token_ids=[tokenizer.convert_tokens_to_ids("<|endoftext|>")])


def _regex(backend, pattern):
    return backend.dispatch_regex(pattern)


def _req(grammar):
    return type("Req", (), {"grammar": grammar})()


def _tok(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_walk_cuts_at_the_first_forbidden_sampled_draft_and_rolls_back(backend, tokenizer):
    g = _regex(backend, r"[0-9]+;")
    g.accept_token(_tok(tokenizer, "1"))
    before = list(g.accepted_tokens)
    drafts = torch.tensor([[_tok(tokenizer, "2"), _tok(tokenizer, "3"), _tok(tokenizer, "a"), _tok(tokenizer, "4")]])
    conf = torch.zeros(1, G)
    plan = walk_drafts([_req(g)], drafts, conf, torch.tensor([True]), torch.tensor([False]), len(tokenizer))
    assert plan.limits.tolist() == [2]
    assert g.accepted_tokens == before and not g.is_terminated()  # rolled back: SGLang advances it on commit
    assert plan.masks[0].shape[0] == 3  # rows for the anchor and the two drafts that pass
    for row in range(3):
        ok = allowed_ids(plan.masks[0][row], len(tokenizer))
        assert _tok(tokenizer, "5") in ok and _tok(tokenizer, "a") not in ok


def test_forbidden_greedy_draft_is_replaced_by_the_drafters_best_allowed_token(backend, tokenizer):
    g = _regex(backend, r"[0-9]+;")
    five, a = _tok(tokenizer, "5"), _tok(tokenizer, "a")
    drafts = torch.tensor([[a, a, a, a]])

    def scores(row, pos):
        logits = torch.zeros(len(tokenizer))
        logits[a] = 10.0  # the drafter prefers a forbidden token, then "5"
        logits[five] = 5.0
        return logits, None

    plan = walk_drafts([_req(g)], drafts, torch.zeros(1, G), torch.tensor([True]), torch.tensor([True]),
                       len(tokenizer), scores)
    assert plan.limits.tolist() == [G] and drafts.tolist() == [[five] * G] and plan.replaced == G


def test_reduced_draft_vocabulary_scores_map_back_to_token_ids(backend, tokenizer):
    g = _regex(backend, r"[0-9]+;")
    five, a = _tok(tokenizer, "5"), _tok(tokenizer, "a")
    ids = torch.tensor(sorted([a, five]))
    drafts = torch.tensor([[a] * G])

    def scores(row, pos):
        return torch.where(ids == a, 3.0, 1.0), ids

    walk_drafts([_req(g)], drafts, torch.zeros(1, G), torch.tensor([True]), torch.tensor([True]), len(tokenizer),
                scores)
    assert drafts[0, 0].item() == five


def test_a_position_with_one_allowed_token_is_a_certain_draft(backend, tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    g = _regex(backend, r"[0-9];")
    semi = _tok(tokenizer, ";")
    g.accept_token(_tok(tokenizer, "7"))  # now only ";" can follow, then only the stop token
    drafts = torch.zeros(1, G, dtype=torch.int64)
    conf = torch.full((1, G), -30.0)
    # not drafted for (draft skipping): forced tokens still become drafts
    plan = walk_drafts([_req(g)], drafts, conf, torch.tensor([False]), torch.tensor([True]), len(tokenizer))
    assert drafts[0, :2].tolist() == [semi, eos]
    assert conf[0, :2].tolist() == [FORCED_CONF_LOGIT] * 2 and plan.forced == 2
    assert plan.limits.tolist() == [2]  # the chain ends where the grammar terminates
    assert not g.is_terminated()


def test_requests_without_a_grammar_keep_their_drafts(backend, tokenizer):
    g = _regex(backend, r"[0-9]+")
    a = _tok(tokenizer, "a")
    drafts = torch.full((2, G), a)
    plan = walk_drafts([_req(None), _req(g)], drafts, torch.zeros(2, G), torch.tensor([True, True]),
                       torch.tensor([False, False]), len(tokenizer))
    assert plan.limits.tolist() == [G, 0] and drafts[0].tolist() == [a] * G and list(plan.masks) == [1]


def test_a_grammar_without_rollback_verifies_nothing_but_gets_its_bonus_mask(backend, tokenizer):
    class NoRollback:
        def __init__(self, inner):
            self.inner = inner
            self.finished = False

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def rollback(self, k):
            raise NotImplementedError

    g = NoRollback(_regex(backend, r"[0-9]+"))
    drafts = torch.full((1, G), _tok(tokenizer, "1"))
    plan = walk_drafts([_req(g)], drafts, torch.zeros(1, G), torch.tensor([True]), torch.tensor([False]),
                       len(tokenizer))
    assert plan.limits.tolist() == [0] and plan.masks[0].shape[0] == 1
    assert _tok(tokenizer, "a") not in allowed_ids(plan.masks[0][0], len(tokenizer))


def test_mask_verify_rows_masks_only_the_grammar_requests_rows(backend, tokenizer):
    V = len(tokenizer)
    g = _regex(backend, r"[0-9]+")
    one = _tok(tokenizer, "1")
    drafts = torch.tensor([[one] * G, [one] * G])
    plan = walk_drafts([_req(None), _req(g)], drafts, torch.zeros(2, G), torch.tensor([True, True]),
                       torch.tensor([False, False]), V)
    verify_lens = torch.tensor([1, 2])
    logits = torch.randn(5, V)
    ref = logits.clone()
    mask_verify_rows(logits, verify_lens, plan)
    assert torch.equal(logits[:2], ref[:2])  # request 0: no grammar
    for r in range(2, 5):
        ok = torch.from_numpy(allowed_ids(plan.masks[1][r - 2], V))
        assert torch.equal(logits[r, ok], ref[r, ok])
        rest = torch.ones(V, dtype=torch.bool)
        rest[ok] = False
        assert torch.isinf(logits[r, rest]).all() and (logits[r, rest] < 0).all()
        assert int(logits[r].argmax()) in set(ok.tolist())


def test_verifying_past_the_walk_is_refused(backend, tokenizer):
    g = _regex(backend, r"[0-9]+")
    drafts = torch.full((1, G), _tok(tokenizer, "a"))
    plan = walk_drafts([_req(g)], drafts, torch.zeros(1, G), torch.tensor([True]), torch.tensor([False]),
                       len(tokenizer))
    with pytest.raises(RuntimeError, match="past its grammar walk"):
        mask_verify_rows(torch.zeros(3, len(tokenizer)), torch.tensor([2]), plan)


def test_json_schema_walk_keeps_drafts_that_follow_the_schema(backend, tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    g = backend.dispatch_json(json.dumps(schema))
    text_ids = tokenizer.encode('{"a": 12}', add_special_tokens=False)
    drafts = torch.tensor([text_ids[:G]])
    plan = walk_drafts([_req(g)], drafts, torch.zeros(1, G), torch.tensor([True]), torch.tensor([False]),
                       len(tokenizer))
    assert plan.limits.tolist() == [min(G, len(text_ids))]
    assert np.array_equal(drafts[0].numpy(), np.array(text_ids[:G]))


def test_jump_forward_text_becomes_drafts_for_a_skipped_request(backend, tokenizer):
    from sglang_dspark.sglang_plugin.grammar import JUMP_CONF_LOGIT, CopySources

    g = _regex(backend, r"Hello, world! [0-9]")
    want = tokenizer.encode("Hello, world! ", add_special_tokens=False)
    drafts = torch.zeros(1, G, dtype=torch.int64)
    conf = torch.full((1, G), -30.0)
    plan = walk_drafts([_req(g)], drafts, conf, torch.tensor([False]), torch.tensor([True]), len(tokenizer),
                       sources=CopySources([None], tokenizer))
    n = min(G, len(want))
    assert drafts[0, :n].tolist() == want[:n] and plan.limits.tolist() == [n]
    assert plan.jump > 0 and plan.jump + plan.forced == n  # a piece no other token can start is forced outright
    assert set(conf[0, :n].tolist()) <= {JUMP_CONF_LOGIT, FORCED_CONF_LOGIT}
    assert g.accepted_tokens == []


def test_lookup_copies_from_the_prompt_where_the_grammar_allows_it(backend, tokenizer):
    from sglang_dspark.sglang_plugin.grammar import LOOKUP_CONF_LOGIT, CopySources

    g = _regex(backend, r"[a-z ]+")
    prompt = tokenizer.encode("the quick brown fox jumps over the lazy dog and the quick", add_special_tokens=False)
    after = tokenizer.encode("the quick brown fox jumps over", add_special_tokens=False)
    i = len(tokenizer.encode("the quick", add_special_tokens=False))
    drafts = torch.zeros(1, G, dtype=torch.int64)
    conf = torch.zeros(1, G)
    plan = walk_drafts([_req(g)], drafts, conf, torch.tensor([True]), torch.tensor([True]), len(tokenizer),
                       sources=CopySources([np.array(prompt)], None))
    n = min(G, len(after) - i)
    assert drafts[0, :n].tolist() == after[i:i + n] and plan.lookup >= n
    assert conf[0, 0].item() == LOOKUP_CONF_LOGIT


def test_copy_sources_are_not_used_for_sampled_drafts(backend, tokenizer):
    """A sampled draft's q is the drafter's distribution: a copied token would break the acceptance ratio."""
    from sglang_dspark.sglang_plugin.grammar import CopySources

    g = _regex(backend, r"Hello, world! [0-9]")
    drafts = torch.zeros(1, G, dtype=torch.int64)
    plan = walk_drafts([_req(g)], drafts, torch.zeros(1, G), torch.tensor([True]), torch.tensor([False]),
                       len(tokenizer), sources=CopySources([None], tokenizer))
    assert plan.jump == 0 and plan.lookup == 0
