"""bench repeats: pooled means, standard errors and ratio intervals from several serve files."""

import json
import math

import pytest

from sglang_dspark.bench.repeats import mean_sem, pool, ratio_interval


def _write(path, rows):
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    return str(path)


def test_mean_sem_and_ratio_interval_by_hand():
    m, se = mean_sem([9.0, 10.0, 11.0])
    assert m == 10.0 and se == pytest.approx(math.sqrt(1.0 / 3))
    r, lo, hi = ratio_interval((10.0, 0.5), (8.0, 0.4))
    rel = math.sqrt(0.05 ** 2 + 0.05 ** 2)
    assert r == 1.25 and lo == pytest.approx(1.25 * (1 - 1.96 * rel)) and hi == pytest.approx(1.25 * (1 + 1.96 * rel))
    assert math.isnan(mean_sem([3.0])[1]) and math.isnan(ratio_interval((1.0, float("nan")), (1.0, 0.1))[1])


def test_pool_groups_by_level_and_divides_by_the_reference(tmp_path):
    files = [
        _write(tmp_path / "a.json", [{"policy": "none", "concurrency": 1, "temperature": 0.0, "aggregate_tok_s": 10},
                                     {"policy": "dspark", "concurrency": 1, "temperature": 0.0, "aggregate_tok_s": 12},
                                     {"policy": "dspark", "concurrency": 4, "temperature": 0.0, "aggregate_tok_s": 30}]),
        _write(tmp_path / "b.json", [{"policy": "none", "concurrency": 1, "temperature": 0.0, "aggregate_tok_s": 12},
                                     {"policy": "dspark", "concurrency": 1, "temperature": 0.0, "aggregate_tok_s": 10}]),
    ]
    rows = {(r["policy"], r["concurrency"]): r for r in pool(files, "aggregate_tok_s", "none")}
    assert rows[("none", 1)]["runs"] == 2 and rows[("none", 1)]["aggregate_tok_s_mean"] == 11.0
    assert "ratio_vs_none" not in rows[("none", 1)]
    d = rows[("dspark", 1)]
    assert d["ratio_vs_none"] == 1.0 and d["ratio_lo95"] < 1.0 < d["ratio_hi95"]
    assert "ratio_vs_none" not in rows[("dspark", 4)]  # no reference at c = 4
