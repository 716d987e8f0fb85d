"""Chain-only verify attention (dspark_kernels/cpu_verify_attention.py) against the fp32 reference, and against what
SGLang's own torch_native EXTEND computes for the same ragged batch."""

import pytest
import torch

from dspark_kernels.cpu_verify_attention import chain_attention_sdpa
from dspark_kernels.flashinfer_verify import ragged_verify_attention_reference

pytestmark = pytest.mark.usefixtures("single_thread")

H, HKV, HD = 4, 2, 16


def ragged_case(chains, kv_lens, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_slots = sum(kv_lens) + 7
    perm = torch.randperm(num_slots, generator=g)  # scattered slots, as a paged pool would have them
    req_to_token = torch.zeros(len(kv_lens) + 2, max(kv_lens) + 3, dtype=torch.int64)
    pool_rows = torch.tensor([2, 0, 3, 1][: len(kv_lens)])
    used = 0
    for r, L in enumerate(kv_lens):
        req_to_token[pool_rows[r], :L] = perm[used:used + L]
        used += L
    k = torch.randn(num_slots, HKV, HD, generator=g).to(dtype)
    v = torch.randn(num_slots, HKV, HD, generator=g).to(dtype)
    q = torch.randn(sum(chains), H, HD, generator=g).to(dtype)
    return q, k, v, req_to_token, pool_rows, torch.tensor(kv_lens), torch.tensor(chains)


def reference(q, k, v, req_to_token, pool_rows, kv_lens, chains):
    qo = torch.zeros(len(chains) + 1, dtype=torch.int64)
    qo[1:] = torch.cumsum(chains, 0)
    kvp = torch.zeros(len(chains) + 1, dtype=torch.int64)
    kvp[1:] = torch.cumsum(kv_lens, 0)
    indices = torch.cat([req_to_token[pool_rows[r], :L] for r, L in enumerate(kv_lens.tolist())])
    return ragged_verify_attention_reference(q.float(), k.float(), v.float(), qo, kvp, indices, kv_lens)


@pytest.mark.parametrize("chains, kv_lens", [
    ([1], [9]), ([8], [30]), ([3, 1, 8, 2], [12, 5, 40, 2]), ([5, 5], [5, 11]), ([0, 4, 0], [6, 9, 3]),
])
def test_matches_reference_fp32(chains, kv_lens):
    q, k, v, r2t, rows, lens, ext = ragged_case(chains, kv_lens, torch.float32)
    out = chain_attention_sdpa(q, torch.zeros_like(q), k, v, r2t, rows, lens, ext)
    assert torch.allclose(out, reference(q, k, v, r2t, rows, lens, ext), atol=2e-5, rtol=1e-5)


def test_bf16_close_to_fp32_reference():
    q, k, v, r2t, rows, lens, ext = ragged_case([3, 8, 1], [20, 64, 7], torch.bfloat16, seed=3)
    out = chain_attention_sdpa(q, torch.zeros_like(q), k, v, r2t, rows, lens, ext)
    assert out.dtype == torch.bfloat16
    assert (out.float() - reference(q, k, v, r2t, rows, lens, ext)).abs().max() < 3e-2


@pytest.mark.parametrize("chains, kv_lens", [([2], [9]), ([8], [30]), ([5, 5], [5, 11]), ([3, 0, 16], [40, 4, 16])])
def test_bf16_chains_are_the_fp32_reference_rounded_once(chains, kv_lens):
    """Reduced-precision chains are computed in fp32 from the exactly upcast values: within one bf16 rounding of
    the fp32 reference (a chain as long as its KV included: the mask is then fully causal)."""
    q, k, v, r2t, rows, lens, ext = ragged_case(chains, kv_lens, torch.bfloat16, seed=13)
    out = chain_attention_sdpa(q, torch.zeros_like(q), k, v, r2t, rows, lens, ext)
    ref = reference(q, k, v, r2t, rows, lens, ext)
    assert torch.allclose(out.float(), ref, atol=1e-5, rtol=2 ** -8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masking_is_causal_inside_the_chain(dtype):
    """Changing the chain's LAST key/value must not change any earlier chain row; it must change the last row."""
    q, k, v, r2t, rows, lens, ext = ragged_case([4], [10], dtype, seed=5)
    base = chain_attention_sdpa(q, torch.zeros_like(q), k, v, r2t, rows, lens, ext)
    last_slot = r2t[rows[0], 9]
    k2, v2 = k.clone(), v.clone()
    k2[last_slot] += 5.0
    v2[last_slot] -= 5.0
    moved = chain_attention_sdpa(q, torch.zeros_like(q), k2, v2, r2t, rows, lens, ext)
    assert torch.equal(moved[:3], base[:3])
    assert not torch.allclose(moved[3].float(), base[3].float(), atol=1e-2)


def test_equals_sglang_torch_native_extend():
    """Same outputs as SGLang's own (padded, redundant) torch_native EXTEND path on a ragged batch."""
    native = pytest.importorskip("sglang.srt.layers.attention.torch_native_backend")
    q, k, v, r2t, rows, lens, ext = ragged_case([3, 1, 8, 2], [12, 5, 40, 2], torch.float32, seed=7)
    ours = chain_attention_sdpa(q, torch.zeros_like(q), k, v, r2t, rows, lens, ext)
    backend = native.TorchNativeAttnBackend.__new__(native.TorchNativeAttnBackend)  # the method needs no state
    theirs = torch.zeros_like(q)
    backend._run_sdpa_forward_extend(q, theirs, k, v, r2t, rows, lens, lens - ext, ext, None, scaling=HD ** -0.5,
                                     enable_gqa=True, causal=True)
    assert torch.allclose(ours, theirs, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_hook_matches_sglang_decode(dtype):
    """Plain decoding through the hook: bf16 within bf16 rounding of SGLang's own decode attention (and of the fp32
    reference), fp32 handed to SGLang's code untouched."""
    native = pytest.importorskip("sglang.srt.layers.attention.torch_native_backend")
    from sglang_dspark.sglang_plugin import cpu_decode_attention

    q, k, v, r2t, rows, lens, ext = ragged_case([1, 1, 1], [12, 70, 3], dtype, seed=11)
    calls = []

    def original(backend, *args, **kwargs):
        calls.append(1)
        return native.TorchNativeAttnBackend._run_sdpa_forward_decode(backend, *args, **kwargs)

    backend = native.TorchNativeAttnBackend.__new__(native.TorchNativeAttnBackend)
    ours = cpu_decode_attention.around_run_sdpa_forward_decode(
        original, backend, q, torch.zeros_like(q), k, v, r2t, rows, lens, None, scaling=HD ** -0.5, enable_gqa=True)
    theirs = torch.zeros_like(q)
    native.TorchNativeAttnBackend._run_sdpa_forward_decode(backend, q, theirs, k, v, r2t, rows, lens, None,
                                                           scaling=HD ** -0.5, enable_gqa=True)
    if dtype == torch.float32:
        assert calls and torch.equal(ours, theirs)
        return
    assert not calls
    ref = reference(q, k, v, r2t, rows, lens, ext)
    assert (ours.float() - ref).abs().max() < 1e-2
    assert (ours.float() - theirs.float()).abs().max() < 2e-2


def test_decode_hook_declines_what_it_does_not_handle(monkeypatch):
    from sglang_dspark.sglang_plugin.cpu_decode_attention import DISABLE_ENV, handles

    q = torch.zeros(2, H, HD, dtype=torch.bfloat16)
    kv = torch.zeros(4, HKV, HD, dtype=torch.bfloat16)
    assert handles(q, kv, None, False, False, None)
    assert not handles(q.float(), kv.float(), None, False, False, None)
    assert not handles(q, kv.float(), None, False, False, None)
    assert not handles(q, kv, torch.tensor([1, 1]), False, False, None)
    assert not handles(q, kv, None, True, False, None)
    assert not handles(q, kv, None, False, False, 16)
    assert handles(q, kv, None, False, False, -1)
    monkeypatch.setenv(DISABLE_ENV, "1")
    assert not handles(q, kv, None, False, False, None)
