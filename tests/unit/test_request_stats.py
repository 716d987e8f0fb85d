"""The per-request `dspark` record: per-step values from StepStats.customized_info (one entry per committed token,
None padding), through api_hooks' per-token collection and request_stats.accumulate, to the summarized record and
its by_source breakdown."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_dspark.metrics.request_stats import accumulate, replace_raw_lists, summarize
from sglang_dspark.sglang_plugin import api_hooks
from sglang_dspark.sglang_plugin.stats import SOURCE_CORPUS, SOURCE_DRAFTER, SOURCE_PROMPT, StepStats


def step(verify, accept, sources=(), fallback=None, drafted=None) -> StepStats:
    s = StepStats(len(verify), drafted=list(drafted if drafted is not None else [1] * len(verify)),
                  sources=list(sources))
    s.finish(torch.tensor(verify), torch.tensor(accept), fallback)
    return s


def test_customized_info_source_on_the_first_committed_token():
    info = step([3, 2, 0], [2, 0, 0], sources=[SOURCE_PROMPT, SOURCE_DRAFTER, -1]).customized_info(False)
    # request 0 commits 3 tokens (2 accepted + bonus), the others 1
    assert info["dspark_source"] == [[1, None, None], [0], [-1]]
    assert info["dspark_verified"] == [[3, None, None], [2], [0]]


def test_customized_info_source_is_minus_one_without_sources_and_on_fallback():
    assert step([2, 1], [1, 0]).customized_info(False)["dspark_source"] == [[-1, None], [-1]]
    fb = step([0, 0], [0, 0], sources=[SOURCE_DRAFTER, SOURCE_CORPUS], fallback="nan").customized_info(False)
    assert fb["dspark_source"] == [[-1], [-1]]
    # a list that does not match the batch is not trusted
    assert step([1, 1], [0, 0], sources=[SOURCE_DRAFTER]).customized_info(False)["dspark_source"] == [[-1], [-1]]


def test_prefill_customized_info_has_the_source_key():
    info = StepStats.prefill_customized_info(2, record_verify_lens=True)
    assert info["dspark_source"] == [[None], [None]]
    assert set(info) == {"dspark_drafted", "dspark_verified", "dspark_accepted", "dspark_source",
                         "dspark_verify_lens"}


def test_by_source_from_steps_with_none_padding():
    """One request over five steps (plus the prefill entry), streamed in two chunks: the record counts each source's
    steps, verified and accepted drafts; -1 and fallback steps belong to no source."""
    steps = [
        step([4], [3], sources=[SOURCE_DRAFTER]),
        step([3], [3], sources=[SOURCE_PROMPT]),
        step([2], [0], sources=[-1]),
        step([0], [0], sources=[SOURCE_CORPUS], fallback="nan"),  # fallback: no source
        step([4], [1], sources=[SOURCE_PROMPT]),
    ]
    per_token = {k: list(v[0]) for k, v in StepStats.prefill_customized_info(1, False).items()}
    for s in steps:
        for k, v in s.customized_info(False).items():
            per_token[k].extend(v[0])
    assert per_token["dspark_source"] == [None, 0, None, None, None, 1, None, None, None, -1, -1, 1, None]
    acc: dict = {}
    cut = 6  # the chunk boundary falls inside step 2's tokens
    accumulate(acc, {k: v[:cut] for k, v in per_token.items()})
    accumulate(acc, {k: v[cut:] for k, v in per_token.items()})
    assert acc["dspark_source"] == [0, 1, -1, -1, 1]
    record = summarize(acc)
    assert record["verify_steps"] == 5 and record["verified"] == 13 and record["accepted"] == 7
    assert record["by_source"] == {"drafter": {"steps": 1, "verified": 4, "accepted": 3},
                                   "prompt": {"steps": 2, "verified": 7, "accepted": 4}}
    assert list(record["by_source"]) == ["drafter", "prompt"]  # corpus: 0 steps, left out


def test_by_source_absent_without_source_info():
    base = {"dspark_drafted": [1, 1], "dspark_verified": [2, 3], "dspark_accepted": [1, 3]}
    assert "by_source" not in summarize(base)  # an older worker: no source list
    assert "by_source" not in summarize({**base, "dspark_source": [-1, -1]})  # nothing proposed anywhere
    assert "by_source" not in summarize({**base, "dspark_source": [0]})  # misaligned: not trusted
    assert summarize({**base, "dspark_source": [2, -1]})["by_source"] == {
        "corpus": {"steps": 1, "verified": 2, "accepted": 1}}


def test_replace_raw_lists_drops_the_source_list():
    acc = {"dspark_drafted": [1], "dspark_verified": [2], "dspark_accepted": [2], "dspark_source": [1]}
    meta = {"id": "r", **{k: list(v) for k, v in acc.items()}}
    replace_raw_lists(meta, acc)
    assert set(meta) == {"id", "dspark"}
    assert meta["dspark"]["by_source"] == {"prompt": {"steps": 1, "verified": 2, "accepted": 2}}


def test_source_flows_through_the_api_hooks():
    """around_collect_customized_info carries every dspark_ key (dspark_source included) per token into the
    request's customized_info; the tokenizer-side hook turns them into the record."""
    req = SimpleNamespace(customized_info=None)
    out = SimpleNamespace(customized_info=None)

    def original(self, i, req_, logits_output):
        assert logits_output.customized_info is None  # ours hidden from SGLang's own collection
        return "ok"

    for s in (step([2, 1], [2, 0], sources=[SOURCE_CORPUS, SOURCE_DRAFTER]),
              step([1, 1], [0, 1], sources=[SOURCE_PROMPT, -1])):
        out.customized_info = s.customized_info(False)
        assert api_hooks.around_collect_customized_info(original, None, 0, req, out) == "ok"
    assert req.customized_info["dspark_source"] == [2, None, None, 1]
    state = SimpleNamespace()
    meta = {"id": "rid-src"}
    api_hooks._update_meta_info(SimpleNamespace(enable_metrics=False), meta, state,
                                {k: [v] for k, v in req.customized_info.items()}, 0)
    assert "dspark_source" not in meta
    assert meta["dspark"]["by_source"] == {"prompt": {"steps": 1, "verified": 1, "accepted": 0},
                                           "corpus": {"steps": 1, "verified": 2, "accepted": 2}}
