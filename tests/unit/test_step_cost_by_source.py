"""benchmarks/step_cost_by_source.py: per kind of decode step, its cost against a plain step and what it returns."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_cost_by_source.py"


def load():
    spec = importlib.util.spec_from_file_location("step_cost_by_source", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(t, plain=False, source=-1, verify=0, accept=0, draft_s=0.0, verify_s=0.1):
    return {"t": t, "plain": plain, "sources": [source], "verify_lens": [verify], "accept_lens": [accept],
            "draft_s": draft_s, "verify_s": verify_s}


def test_kinds_costs_and_tokens_per_plain_step():
    mod = load()
    rows, t = [], 0.0
    for i in range(6):  # plain steps: 100 ms forward + 10 ms scheduler gap
        t += 0.11
        rows.append(row(t, plain=True))
    for i in range(4):  # prompt-lookup verifies: 3 accepted, 110 ms forward, no draft pass
        t += 0.12
        rows.append(row(t, source=1, verify=7, accept=3, verify_s=0.11))
    for i in range(4):  # drafter: draft 20 ms, forward 110 ms, nothing accepted
        t += 0.14
        rows.append(row(t, source=0, verify=2, accept=0, draft_s=0.02, verify_s=0.11))
    t += 5.0  # a prefill / idle gap is not scheduler work
    rows.append(row(t, plain=True))
    table = mod.summarise(rows)
    assert table["plain"]["steps"] == 7 and table["plain"]["gap_ms"] == pytest.approx(10, abs=0.01)
    assert table["prompt"]["cost_vs_plain"] == pytest.approx(0.12 / 0.11, abs=1e-3)
    assert table["prompt"]["tokens_per_plain_step"] == pytest.approx(4 * 0.11 / 0.12, abs=1e-3)
    assert table["drafter"]["tokens_per_plain_step"] < 1  # costs more than a plain step, returns one token
    assert "corpus" not in table
    assert mod.kind({"verify_lens": [1, 2]}) is None  # batches of two are not read
