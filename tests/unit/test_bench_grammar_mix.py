"""bench grammar_mix: the paired bursts differ only in request 0's response_format."""

from sglang_dspark.bench.grammar_mix import bursts, free_mate_tok_s
from sglang_dspark.bench.load import LoadResult, RequestResult

RF = {"response_format": {"type": "json_object"}}


def test_bursts_pair_the_same_prompts_with_and_without_the_grammar():
    free = [("gsm8k", f"q{i}") for i in range(10)]
    structured = [("json", "extract a", RF), ("json", "extract b", RF)]
    for k in range(4):
        mixed, plain = bursts(free, structured, k, 4)
        assert len(mixed) == len(plain) == 4
        assert mixed[0] == structured[k % 2] and plain[0] == structured[k % 2][:2]
        assert mixed[1:] == plain[1:] and all(len(p) == 2 for p in mixed[1:])
    assert bursts(free, structured, 0, 4)[0][1:] != bursts(free, structured, 1, 4)[0][1:]


def test_free_mates_exclude_the_structured_request_whatever_the_finish_order():
    reqs = [RequestResult("f", 11, 1.0, 2.0, index=2), RequestResult("j", 101, 1.0, 2.0, index=0),
            RequestResult("f", 21, 1.0, 2.0, index=1)]
    assert free_mate_tok_s(LoadResult(3, 2.0, reqs)) == (10 + 20) / 2
