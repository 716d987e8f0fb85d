import torch

from sglang_dspark.control import probe_due
from sglang_dspark.control.draft_skip import draft_mask


def test_probes_back_off_exponentially_then_periodically():
    streak = torch.arange(0, 130)
    due = [int(s) for s in streak[probe_due(streak, first=4, max_gap=32)]]
    assert due == [0, 4, 8, 16, 32, 64, 96, 128]


def _run_gate(gate, R, steps, verified_at=()):
    """Drive the gate like the worker: returns the steps on which anybody was drafted for."""
    from sglang_dspark.control import BatchProbeGate  # noqa: F401

    streak = torch.tensor([0, 1, 2, 3][:R])  # different phases, as requests joining at different times
    drafted_steps = []
    for step in range(steps):
        active = gate.active(streak, step)
        verified = 1 if step in verified_at and bool(active.any()) else 0
        if bool(active.any()):
            drafted_steps.append(step)
        gate.observe(step, int(active.sum()), verified)
        streak = torch.where(active & (verified > 0), torch.zeros_like(streak), streak + 1)
    return drafted_steps


def test_batch_gate_aligns_probes_and_backs_off_when_nothing_is_verified():
    from sglang_dspark.control import BatchProbeGate

    steps = _run_gate(BatchProbeGate(quiet_after=2, first=4, max_gap=32), R=4, steps=200)
    # without the gate, four requests in different phases would each be probed on their own steps
    unaligned = {s for s in range(200) if bool(probe_due(torch.tensor([0, 1, 2, 3]) + s).any())}
    assert len(steps) < len(unaligned) / 2
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert gaps[-1] == 32 and gaps == sorted(gaps)  # doubling, then capped


def test_batch_gate_reopens_per_request_probing_after_a_verified_draft():
    from sglang_dspark.control import BatchProbeGate

    gate = BatchProbeGate(quiet_after=2, first=4, max_gap=32)
    for step in range(3):
        gate.observe(step, drafted=4, verified=0)
    assert gate.batch_mode
    assert not bool(gate.active(torch.zeros(4, dtype=torch.long), 3).any())  # a fresh request waits in batch mode
    gate.observe(10, drafted=4, verified=2)
    assert not gate.batch_mode
    assert bool(gate.active(torch.zeros(4, dtype=torch.long), 11).all())


def test_batch_gate_ignores_steps_that_drafted_nothing():
    from sglang_dspark.control import BatchProbeGate

    gate = BatchProbeGate(quiet_after=2)
    for step in range(10):
        gate.observe(step, drafted=0, verified=0)
    assert not gate.batch_mode


def test_a_probe_step_does_not_bring_back_a_request_whose_chain_is_worthier():
    probe = torch.tensor([True, True, False, True])
    chain = torch.tensor([True, False, False, False])
    nospec = torch.tensor([False, False, False, True])
    assert draft_mask(4, probe=probe, chain_worthier=chain, no_speculation=nospec).tolist() == [False, True, False,
                                                                                                 False]


def test_draft_mask_with_no_reasons_drafts_everybody_and_each_reason_alone_leaves_its_requests_out():
    assert draft_mask(3).tolist() == [True, True, True]
    only = torch.tensor([False, True, False])
    assert draft_mask(3, chain_worthier=only).tolist() == [True, False, True]
    assert draft_mask(3, grammar_copied=only).tolist() == [True, False, True]
    assert draft_mask(3, no_speculation=only).tolist() == [True, False, True]
    assert draft_mask(3, probe=only).tolist() == [False, True, False]
