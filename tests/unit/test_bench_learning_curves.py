"""bench learning_curves: held-out tau and smoothed training top-1 of fit runs against blocks, JSON + PNG."""

import json

from sglang_dspark.bench.learning_curves import add_args, run


def test_curves_read_fit_logs_and_plot(tmp_path):
    import argparse

    for name, tau0 in (("warm", 1.5), ("scratch", 1.0)):
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": 0, "blocks": 0, "heldout_tau": tau0, "heldout_top1": 0.1, "heldout_blocks": 9}]
        rows += [{"step": s, "blocks": 10 * s, "top1": s / 10} for s in range(1, 5)]
        rows.append({"step": 4, "blocks": 40, "top1": 0.5, "heldout_tau": tau0 + 0.2, "heldout_top1": 0.3,
                     "heldout_blocks": 9})
        (d / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = argparse.ArgumentParser()
    add_args(p)
    rep = run(p.parse_args(["--run", f"warm={tmp_path / 'warm'}", "--run", f"scratch={tmp_path / 'scratch'}",
                            "--out", str(tmp_path / "lc"), "--smooth", "2"]))
    warm = rep["curves"]["warm"]
    assert [e["blocks"] for e in warm["eval"]] == [0, 40] and warm["eval"][1]["tau"] == 1.7
    assert [round(t["top1_smoothed"], 3) for t in warm["train"]] == [0.1, 0.15, 0.25, 0.35, 0.45]
    assert (tmp_path / "lc.png").stat().st_size > 1000 and json.loads((tmp_path / "lc.json").read_text())
