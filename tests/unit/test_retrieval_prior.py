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


def test_leave_family_out_scores_every_answer_against_a_table_without_its_family():
    import numpy as np

    from sglang_dspark.eval.retrieval_prior import table_proposers

    a = [10, 11, 12, 13, 14, 15, 16, 17]  # family "math" always continues 10 -> 11 -> 12 ...
    b = [10, 21, 22, 23, 24, 25, 26, 27]  # family "code" continues 10 -> 21 -> 22 ...
    rows = [("math", [1, 2], a)] * 3 + [("code", [1, 2], b)] * 3
    scored, proposers = table_proposers(rows, "leave-family-out", 0.1)
    assert len(scored) == len(proposers) == len(rows)  # every answer is scored once
    math_cand = proposers[0](np.array([1, 2, 10]), 3)
    code_cand = proposers[3](np.array([1, 2, 10]), 3)
    assert list(math_cand.tokens) == [21, 22, 23]  # a math answer meets only the code family's n-grams
    assert list(code_cand.tokens) == [11, 12, 13]

    one_family = [("math", [1, 2], a)] * 20
    scored, proposers = table_proposers(one_family, "leave-family-out", 0.1)
    assert len(scored) == 2  # one family: every 10th answer held out of a table of the rest
    assert list(proposers[0](np.array([1, 2, 10]), 2).tokens) == [11, 12]
