"""eval.retrieval_prior: chat-templated prompt ids from the embedded tokenizer (a BatchEncoding in newer HF)."""

from sglang_dspark.embedded import DEFAULT_TARGET_DIR
from sglang_dspark.eval.retrieval_prior import prompt_ids


def test_prompt_ids_are_the_chat_templated_token_ids():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET_DIR)
    ids = prompt_ids(tok, "hello there")
    assert ids and all(isinstance(t, int) for t in ids)
    text = tok.decode(ids)
    assert "hello there" in text and text.rstrip().endswith("assistant")
