import torch

from sglang_dspark.control import probe_due


def test_probes_back_off_exponentially_then_periodically():
    streak = torch.arange(0, 130)
    due = [int(s) for s in streak[probe_due(streak, first=4, max_gap=32)]]
    assert due == [0, 4, 8, 16, 32, 64, 96, 128]
