"""eval.retrieval_prior: chat-templated prompt ids from the embedded tokenizer, and the prior it shipped."""

from sglang_dspark.embedded import DEFAULT_TARGET_DIR
from sglang_dspark.train.chat import render_prompt


def test_prompt_ids_are_the_chat_templated_token_ids():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET_DIR)
    ids = render_prompt(tok, "hello there")
    assert ids and all(isinstance(t, int) for t in ids)
    text = tok.decode(ids)
    assert "hello there" in text and text.rstrip().endswith("assistant")


def test_the_shipped_drafter_carries_a_fitted_prior_that_loads():
    import json

    from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR
    from sglang_dspark.retrieval import RetrievalConfidence
    from sglang_dspark.retrieval.confidence import FILE_NAME

    path = DEFAULT_DRAFTER_DIR / FILE_NAME
    gamma = json.loads((DEFAULT_DRAFTER_DIR / "config.json").read_text())["block_size"]
    conf = RetrievalConfidence.from_file(gamma, path)
    explored = [(m, c, h) for m in range(1, 13) for c in (1, 2, 4, 8) for h in range(4)
                if conf.observations("prompt", m, c, h) > 0]
    assert explored, f"{path}: no fitted cell"
    assert json.loads(path.read_text())["fitted_on"]["sequences"] > 0


def test_a_prior_fits_on_existing_greedy_answers_without_a_server(tmp_path):
    import json

    from sglang_dspark.eval.retrieval_prior import main
    from sglang_dspark.retrieval import RetrievalConfidence

    code = "def area(width, height):\n    return width * height\n"
    rows = [{"id": "a", "messages": [{"role": "user", "content": "Add type hints:\n" + code},
                                     {"role": "assistant", "content": code.replace("width, height", "width: int, height: int")}]},
            {"id": "b", "messages": [{"role": "user", "content": "hi"}]}]  # no answer: skipped
    data = tmp_path / "generated.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "retrieval_confidence.json"
    fitted = main(["--conversations", str(data), "--out", str(out)])
    assert fitted["fitted_on"]["sequences"] == 1 and fitted["fitted_on"]["conversations"] == ["generated.jsonl"]
    conf = RetrievalConfidence.from_file(7, out)
    assert any(conf.observations("prompt", m, c, h) > 0 for m in range(1, 13) for c in (1, 2, 4, 8) for h in range(4))
