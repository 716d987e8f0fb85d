"""bench training_rounds: a drafter's accumulated rounds grouped by eval setting, written as JSON + PNG."""

import json

from sglang_dspark.bench.__main__ import main


def test_rounds_are_grouped_by_how_they_were_measured(tmp_path):
    fp32 = {"dtype": "fp32", "limit": 10, "tokens": 64}
    bf16 = {"dtype": "bf16", "limit": 20, "tokens": 64}
    rows = [{"baseline": True, "blocks": 0, "cpu_hours": 0.0, "tau": 1.41, "shipped": True, "eval": fp32},
            {"blocks": 90, "cpu_hours": 1.0, "tau": 1.34, "shipped": False, "eval": fp32},
            {"baseline": True, "blocks": 90, "cpu_hours": 1.0, "tau": 1.41, "shipped": True, "eval": bf16},
            {"blocks": 300, "cpu_hours": 2.5, "tau": 1.5, "shipped": True, "eval": bf16}]
    (tmp_path / "training").mkdir()
    (tmp_path / "training" / "curve.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["training_rounds", "--drafter", str(tmp_path), "--out", str(tmp_path / "rounds")])
    report = json.loads((tmp_path / "rounds.json").read_text())
    groups = report["settings"]
    assert sorted(groups) == ["bf16, 20 prompts/dataset, 64 tokens", "fp32, 10 prompts/dataset, 64 tokens"]
    assert [r["tau"] for r in groups["bf16, 20 prompts/dataset, 64 tokens"]] == [1.41, 1.5]
    assert (tmp_path / "rounds.png").stat().st_size > 0
