"""Single-stream table helpers: speedups against `none` per (dataset, temperature), and the bar chart."""

from sglang_dspark.bench import single_stream


def test_speedups_are_per_dataset_and_temperature(tmp_path):
    rows = [{"policy": "none", "dataset": "gsm8k", "temperature": 0.0, "tok_s": 10.0},
            {"policy": "none", "dataset": "gsm8k", "temperature": 1.0, "tok_s": 8.0},
            {"policy": "dspark", "dataset": "gsm8k", "temperature": 0.0, "tok_s": 12.0},
            {"policy": "dspark", "dataset": "gsm8k", "temperature": 1.0, "tok_s": 8.0},
            {"policy": "dspark", "dataset": "humaneval", "temperature": 0.0, "tok_s": 9.0}]  # no `none` row
    out = single_stream.with_speedups(rows)
    assert [r["speedup_vs_none"] for r in out] == [1.0, 1.0, 1.2, 1.0, None]
    png = single_stream.plot(out, tmp_path / "s.png")
    assert png.stat().st_size > 1000
