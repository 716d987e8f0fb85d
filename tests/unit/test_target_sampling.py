"""The worker's own plain-decode sampler (sglang_plugin/target_sampling.py) against the dense reference law."""

from types import SimpleNamespace

import torch
from scipy.stats import chisquare

from sglang_dspark.sglang_plugin.target_sampling import processed_logits, sample_plain, samples_plain_itself
from sglang_dspark.verify.target_dist import process_logits, target_probs

V = 40


def _si(**over):
    g = torch.Generator().manual_seed(5)
    si = SimpleNamespace(
        temperatures=torch.tensor([[1.0], [0.7], [1.3], [1.0]]),
        top_ks=torch.tensor([1 << 30, 8, 1 << 30, 1]),  # row 3 greedy
        top_ps=torch.tensor([1.0, 0.9, 0.8, 1.0]),
        min_ps=torch.tensor([0.0, 0.0, 0.05, 0.0]),
        need_min_p_sampling=True,
        acc_additive_penalties=-0.5 * torch.rand(4, V, generator=g),
        acc_scaling_penalties=1.0 + 0.3 * (torch.rand(4, V, generator=g) > 0.7).float(),
        logit_bias=torch.zeros(4, V),
        is_all_greedy=False, grammars=None, has_custom_logit_processor=False, sampling_seed=None,
    )
    si.logit_bias[:, 3] = 2.5
    for k, v in over.items():
        setattr(si, k, v)
    return si


def test_logit_bias_is_added_after_the_repetition_penalty():
    logits = torch.tensor([[2.0, -2.0]])
    out = process_logits(logits, scaling=torch.tensor([[2.0, 2.0]]), bias=torch.tensor([[1.0, 1.0]]))
    assert out.tolist() == [[2.0, -3.0]]  # (2 / 2) + 1, (-2 * 2) + 1


def _pvalue(counts: torch.Tensor, law_row: torch.Tensor, n: int) -> float:
    keep = law_row * n >= 5
    if int(keep.sum()) < 2:  # one token holds the mass (a greedy row): all draws must be it
        return 1.0 if counts[keep].sum() == n else 0.0
    exp = law_row[keep].double()
    return float(chisquare(counts[keep].numpy(), (exp / exp.sum() * counts[keep].sum()).numpy()).pvalue)


def test_sample_plain_draws_the_processed_target_law():
    si = _si()
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(1)) * 2
    rows = torch.arange(4)
    law = target_probs(processed_logits(logits, si, rows), si.temperatures.view(-1), si.top_ks, si.top_ps, si.min_ps)
    n = 20000
    torch.manual_seed(0)
    draws = torch.stack([sample_plain(logits, si) for _ in range(n)], 1)
    for r in range(4):
        counts = torch.bincount(draws[r], minlength=V).double()
        assert counts[law[r] == 0].sum() == 0, f"row {r} drew a token outside its support"
        assert _pvalue(counts, law[r], n) > 1e-3, f"row {r}"
    # the same statistic rejects a sampler that drops the penalties
    plain = _si(acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None)
    wrong = torch.stack([sample_plain(logits, plain) for _ in range(n)], 1)
    assert _pvalue(torch.bincount(wrong[0], minlength=V).double(), law[0], n) < 1e-6


def test_sglang_keeps_sampling_what_we_do_not_reproduce():
    free = [SimpleNamespace(grammar=None)] * 4
    assert samples_plain_itself(_si(), free)
    assert not samples_plain_itself(_si(is_all_greedy=True), free)
    # a grammar request keeps SGLang's sampler even while sampling_info.grammars is still unset (it is filled only
    # inside the target forward)
    assert not samples_plain_itself(_si(), free[:3] + [SimpleNamespace(grammar=object())])
    assert not samples_plain_itself(_si(has_custom_logit_processor=True), free)
    assert not samples_plain_itself(_si(sampling_seed=torch.tensor([1, 2, 3, 4])), free)
