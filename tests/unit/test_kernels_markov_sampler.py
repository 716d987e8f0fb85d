"""Markov sampler kernel vs its torch reference (CPU: Triton interpreter; CUDA: compiled, when present)."""

import os
import sys
from pathlib import Path

import pytest
import torch

# The Triton interpreter must be chosen before triton decorates the kernels. On a CUDA machine the kernels run
# compiled instead, and the CPU cases are skipped.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root: the dspark_kernels/ package

from dspark_kernels import markov_sample, markov_sample_reference  # noqa: E402
from dspark_kernels._rng import HAS_TRITON  # noqa: E402
from tests.kernel_checks import chi2_critical, device_or_skip  # noqa: E402

_KERNEL = None
if HAS_TRITON:
    from dspark_kernels import markov_sample_triton  # noqa: E402
    from dspark_kernels.markov_sampler import _markov_step_kernel as _KERNEL  # noqa: E402


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    n = counts.sum().item()
    expected = probs.double() * n
    keep = expected > 0
    stat = (((counts.double() - expected) ** 2) / expected.clamp(min=1e-12))[keep].sum().item()
    return stat, int(keep.sum().item()) - 1


def _problem(R, G, V, rank, dtype, device, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    U = (torch.randn(R, G, V, generator=gen) * 2 * scale).to(dtype)
    w1 = (torch.randn(V, rank, generator=gen) * 0.5).to(dtype)
    w2 = (torch.randn(V, rank, generator=gen) * 0.5).to(dtype)
    anchor = torch.randint(0, V, (R,), generator=gen)
    temps = torch.tensor([0.0, 1.0, 0.7, 1.5, 1e-6, 0.3, 1.0, 2.0])[:R].repeat((R + 7) // 8)[:R]
    seeds = torch.randint(0, 2**62, (R,), generator=gen)
    return [t.to(device) for t in (U, w1, w2, anchor, temps, seeds)]


def _assert_same(a, b, exact_tokens=True):
    if exact_tokens:
        assert torch.equal(a.tokens, b.tokens)
    else:  # compiled GPU math (fast log/exp, dot order) may flip a near-tie now and then
        assert (a.tokens == b.tokens).float().mean().item() >= 0.98
        same = (a.tokens == b.tokens).all(dim=1)
        a_p, b_p, a_l, b_l = a.token_probs[same], b.token_probs[same], a.lse[same], b.lse[same]
        torch.testing.assert_close(a_p, b_p, rtol=1e-3, atol=1e-5)
        torch.testing.assert_close(a_l, b_l, rtol=1e-4, atol=1e-3)
        return
    torch.testing.assert_close(a.token_probs, b.token_probs, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(a.lse, b.lse, rtol=1e-5, atol=1e-4)
    assert torch.equal(a.markov_emb, b.markov_emb)
    if a.logits is not None:
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_triton_matches_reference(device, gamma):
    device_or_skip(device, _KERNEL)
    args = _problem(8, gamma, 64, 16, torch.float32, device, seed=gamma)
    got = markov_sample_triton(*args, return_logits=True, block_v=32)
    ref = markov_sample_reference(*args, return_logits=True)
    _assert_same(got, ref, exact_tokens=device == "cpu")
    greedy = args[4] < 1e-5
    assert torch.all(got.token_probs[greedy] == 1.0)
    assert torch.all((got.token_probs > 0) & (got.token_probs <= 1.0))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_triton_bf16_odd_shapes(device):
    device_or_skip(device, _KERNEL)
    # R not a multiple of the request tile, V not a multiple of the vocab tile, rank not a power of two
    args = _problem(5, 3, 50, 24, torch.bfloat16, device, seed=11)
    got = markov_sample_triton(*args, block_v=16)
    ref = markov_sample_reference(*args)
    _assert_same(got, ref, exact_tokens=device == "cpu")
    assert got.logits is None and got.markov_emb.dtype == torch.bfloat16


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("programs_v", [1, 3, 7])
def test_triton_vocab_split_across_programs(device, programs_v):
    """V = 100 in 7 tiles of 16 (last one ragged), split over 1 / 3 / 7 programs: partials combine exactly."""
    device_or_skip(device, _KERNEL)
    args = _problem(20, 3, 100, 16, torch.float32, device, seed=13)
    got = markov_sample_triton(*args, return_logits=True, block_r=16, block_v=16, programs_v=programs_v)
    ref = markov_sample_reference(*args, return_logits=True)
    _assert_same(got, ref, exact_tokens=device == "cpu")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_triton_greedy_ties_pick_the_lowest_id(device):
    """Greedy rows with exact ties across vocabulary tiles / programs: the lowest token id, as torch.argmax."""
    device_or_skip(device, _KERNEL)
    R, G, V, rank = 4, 2, 64, 16
    U = torch.zeros(R, G, V)
    U[:, :, [5, 21, 40, 63]] = 3.0  # equal maxima in tiles 0, 1, 2, 3
    U[1, :, 5] = 0.0  # row 1: first maximum at 21
    w = torch.zeros(V, rank)  # no Markov correction: logits = U exactly
    args = [U, w, w, torch.zeros(R, dtype=torch.int64), torch.zeros(R), torch.arange(R)]
    args = [t.to(device) for t in args]
    got = markov_sample_triton(*args, block_r=16, block_v=16, programs_v=3)
    ref = markov_sample_reference(*args)
    assert torch.equal(got.tokens.cpu(), ref.tokens.cpu())
    assert got.tokens[:, 0].tolist() == [5, 21, 5, 5]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("all_greedy", [True, False, None])
def test_triton_all_greedy_batch_skips_noise_with_the_same_outputs(device, all_greedy):
    """The host-side greedy hint compiles the Gumbel draws out; tokens, probs, lse and logits stay the reference's.
    None derives the hint from host temperatures (CPU) or assumes sampling (CUDA, no sync)."""
    device_or_skip(device, _KERNEL)
    args = _problem(12, 4, 80, 16, torch.float32, device, seed=5)
    args[4] = torch.zeros_like(args[4])
    got = markov_sample_triton(*args, return_logits=True, block_v=16, programs_v=3, all_greedy=all_greedy)
    ref = markov_sample_reference(*args, return_logits=True)
    _assert_same(got, ref, exact_tokens=device == "cpu")
    assert torch.all(got.token_probs == 1.0)


def test_triton_greedy_hint_is_a_promise():
    """A false hint (sampled rows, all_greedy=True) gives the argmax chain: the caller must only say it when true.
    Shown here so that a change making the kernel ignore the hint is noticed."""
    device_or_skip("cpu", _KERNEL)
    args = _problem(8, 3, 64, 16, torch.float32, "cpu", seed=9)
    args[4] = torch.ones_like(args[4])
    hinted = markov_sample_triton(*args, block_v=16, all_greedy=True)
    greedy_args = list(args)
    greedy_args[4] = torch.zeros_like(args[4])
    assert torch.equal(hinted.tokens, markov_sample_reference(*greedy_args).tokens)
    assert not torch.equal(hinted.tokens, markov_sample_reference(*args).tokens)


def test_launch_config_rejects_bad_tiles():
    if not HAS_TRITON:
        pytest.skip("triton is not importable")
    from dspark_kernels.markov_sampler import markov_launch_config

    cfg = markov_launch_config(128, 151936, 256, torch.device("cpu"))
    assert cfg["programs_v"] * cfg["tiles_per_prog"] >= cfg["nt"] > (cfg["programs_v"] - 1) * cfg["tiles_per_prog"]
    with pytest.raises(ValueError, match="block_v"):
        markov_launch_config(8, 64, 16, torch.device("cpu"), block_v=24)


def test_reference_greedy_is_the_markov_argmax_chain():
    U, w1, w2, anchor, _, seeds = _problem(4, 5, 32, 8, torch.float32, "cpu", seed=3)
    out = markov_sample_reference(U, w1, w2, anchor, torch.zeros(4), seeds)
    for r in range(4):
        prev = int(anchor[r])
        for k in range(5):
            assert torch.equal(out.markov_emb[r, k], w1[prev])
            logits = U[r, k] + w2 @ w1[prev]
            prev = int(logits.argmax())
            assert int(out.tokens[r, k]) == prev


def _exact_chain_distributions(U, w1, w2, anchor, temp):
    """p(x0) and p(x1) (marginal over x0) for one request with G = 2, computed exactly."""
    z0 = (U[0] + w2 @ w1[anchor]) / temp
    p0 = torch.softmax(z0.double(), -1)
    z1 = (U[1][None, :] + w1 @ w2.T) / temp  # row a: logits of x1 given x0 = a
    p1 = p0 @ torch.softmax(z1.double(), -1)
    return p0, p1


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_triton_sampling_distribution_chi_square(device):
    device_or_skip(device, _KERNEL)
    V, rank, draws, temp = 8, 16, 1024, 0.9
    gen = torch.Generator().manual_seed(5)
    U1 = torch.randn(2, V, generator=gen)
    w1 = torch.randn(V, rank, generator=gen) * 0.4
    w2 = torch.randn(V, rank, generator=gen) * 0.4
    anchor = 3
    # one request per draw: same inputs, different seeds
    U = U1[None].repeat(draws, 1, 1)
    out = markov_sample_triton(U.to(device), w1.to(device), w2.to(device),
                               torch.full((draws,), anchor, device=device),
                               torch.full((draws,), temp, device=device),
                               torch.arange(draws, device=device) * 7919 + 1)
    p0, p1 = _exact_chain_distributions(U1, w1, w2, anchor, temp)
    tokens = out.tokens.cpu()
    for k, p in ((0, p0), (1, p1)):
        stat, df = _chi2(torch.bincount(tokens[:, k], minlength=V), p)
        assert stat < chi2_critical(df), f"position {k}: chi2 {stat:.1f} over df {df}"
    # the returned draft probability is the exact conditional probability of the sampled token
    torch.testing.assert_close(out.token_probs[:, 0].cpu().double(), p0[tokens[:, 0]], rtol=1e-4, atol=1e-6)


def test_reference_sampling_distribution_chi_square_many_draws():
    V, rank, draws, temp = 6, 8, 20000, 1.3
    gen = torch.Generator().manual_seed(9)
    U1 = torch.randn(2, V, generator=gen)
    w1 = torch.randn(V, rank, generator=gen) * 0.5
    w2 = torch.randn(V, rank, generator=gen) * 0.5
    out = markov_sample_reference(U1[None].repeat(draws, 1, 1), w1, w2, torch.full((draws,), 2),
                                  torch.full((draws,), temp), torch.arange(draws) + 123)
    z0 = (U1[0] + w2 @ w1[2]) / temp
    p0 = torch.softmax(z0.double(), -1)
    p1_given = torch.softmax(((U1[1][None, :] + w1 @ w2.T) / temp).double(), -1)
    joint = (p0[:, None] * p1_given).flatten()  # p(x0 = a, x1 = b)
    cells = out.tokens[:, 0] * V + out.tokens[:, 1]
    stat, df = _chi2(torch.bincount(cells, minlength=V * V), joint)
    assert stat < chi2_critical(df), f"joint chi2 {stat:.1f} over df {df}"


def test_dispatcher_reasons_and_other_heads():
    R, G, V, rank, d = 3, 4, 32, 8, 12
    U, w1, w2, anchor, temps, seeds = _problem(R, G, V, rank, torch.float32, "cpu", seed=4)
    auto = markov_sample(U, w1, w2, anchor, temps, seeds)
    assert auto.backend == "torch" and "cpu" in auto.reason
    hidden = torch.randn(R, G, d)

    # gated head with a saturated gate (g = 1) is the vanilla head
    gate = (torch.zeros(rank, d + rank), torch.full((rank,), 40.0))
    gated = markov_sample(U, w1, w2, anchor, temps, seeds, head_kind="gated", hidden=hidden, gate_proj=gate,
                          return_logits=True)
    assert gated.backend == "torch" and "gated" in gated.reason
    vanilla = markov_sample_reference(U, w1, w2, anchor, temps, seeds, return_logits=True)
    assert torch.equal(gated.tokens, vanilla.tokens)
    torch.testing.assert_close(gated.logits, vanilla.logits)

    # rnn head, first position (state 0): logits_0 = U_0 + W2 tanh(a_o)
    jw, jb = torch.randn(3 * rank, 2 * rank + d) * 0.3, torch.randn(3 * rank) * 0.1
    rnn = markov_sample(U, w1, w2, anchor, temps, seeds, head_kind="rnn", hidden=hidden, joint_proj=(jw, jb),
                        return_logits=True)
    assert "rnn" in rnn.reason
    z = torch.cat([torch.zeros(R, rank), w1[anchor], hidden[:, 0]], -1) @ jw.T + jb
    a_o = z[:, 2 * rank:]
    torch.testing.assert_close(rnn.logits[:, 0], U[:, 0] + torch.tanh(a_o) @ w2.T, rtol=1e-5, atol=1e-5)

    with pytest.raises(ValueError, match="gated"):
        markov_sample(U, w1, w2, anchor, temps, seeds, head_kind="gated", hidden=hidden, gate_proj=gate,
                      backend="triton")


@pytest.mark.gpu
def test_cuda_full_vocab_matches_reference():
    device_or_skip("cuda", _KERNEL)
    args = _problem(16, 7, 151936, 256, torch.bfloat16, "cuda", seed=1, scale=3.0)
    got = markov_sample(*args, return_logits=True)
    assert got.backend == "triton"
    ref = markov_sample_reference(*args, return_logits=True)
    _assert_same(got, ref, exact_tokens=False)
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-3, atol=1e-2)
