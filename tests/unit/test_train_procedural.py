import json

from sglang_dspark.train import procedural
from sglang_dspark.train.generate import DEFAULT_SOURCES, TRAIN_POOL, _load_prompt_rows


def test_prompts_are_a_function_of_source_and_index():
    for source in procedural.SOURCES:
        first = [procedural.prompt(source, i) for i in range(20)]
        assert first == [procedural.prompt(source, i) for i in range(20)]
        assert len(set(first)) >= 15, source  # not one template over and over


def test_pool_rows_are_distinct_interleaved_and_keep_their_indices():
    rows = procedural.rows(per_source=50)
    assert len(rows) == 150
    assert [r[1] for r in rows[:3]] == list(procedural.SOURCES)
    for source in procedural.SOURCES:
        texts = [t for _, s, t in rows if s == source]
        assert len(set(texts)) == 50
    for rid, source, text in rows[:30]:
        assert procedural.prompt(source, int(rid.rsplit("-", 1)[1])) == text


def test_code_prompts_never_use_the_code_edit_benchmark_modules():
    funcs = procedural.stdlib_functions()
    assert len(funcs) > 300
    assert not {m for m, *_ in funcs} & set(procedural.HELD_OUT_MODULES)
    from benchmarks.workloads.make_code_edit import MODULES

    assert set(MODULES) <= set(procedural.HELD_OUT_MODULES)


def test_no_procedural_prompt_is_an_eval_prompt():
    from sglang_dspark.bench.prompts import data_root

    evals = set()
    for path in (data_root() / "eval").glob("*.jsonl"):
        with open(path) as f:
            evals |= {json.loads(line)["turns"][0].strip() for line in f if line.strip()}
    made = {t.strip() for _, _, t in procedural.rows(per_source=300)}
    assert evals and not made & evals


def test_the_pool_appends_procedural_prompts_after_the_files():
    files = _load_prompt_rows(DEFAULT_SOURCES)
    pool = _load_prompt_rows(TRAIN_POOL)
    assert pool[: len(files)] == files  # a cursor into the files still points where it did
    assert pool[len(files)][1] == "proc-math"
    assert len(pool) == len(files) + len(procedural.SOURCES) * procedural.PER_SOURCE
