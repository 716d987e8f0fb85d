"""Ragged verify attention: Triton kernel vs torch reference; FlashInfer CUDA-graph wrapper on a GPU."""

import math
import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # choose the interpreter before triton decorates the kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root: the dspark_kernels/ package

from dspark_kernels import ragged_verify_attention_reference  # noqa: E402
from dspark_kernels._rng import HAS_TRITON  # noqa: E402
from tests.kernel_checks import cuda_flashinfer_or_skip, device_or_skip, ragged_layout  # noqa: E402
from dspark_kernels.flashinfer_verify import pad_verify_layout  # noqa: E402

_KERNEL = None
if HAS_TRITON:
    from dspark_kernels import ragged_verify_attention_triton  # noqa: E402
    from dspark_kernels.flashinfer_verify import _ragged_verify_attn_kernel as _KERNEL  # noqa: E402


CASES = [  # chain lengths (anchor + drafts; 0 = padding slot), prefix lengths
    ([1, 4, 0, 8, 2], [5, 0, 7, 20, 13]),
    ([3], [0]),
    ([8, 8, 1, 0, 5, 2, 7, 4], [17, 3, 1, 0, 9, 30, 2, 6]),
]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("page_size,dtype", [(1, torch.float32), (4, torch.float32), (8, torch.bfloat16)])
def test_triton_matches_reference(device, case, page_size, dtype):
    device_or_skip(device, _KERNEL)
    chains, prefixes = CASES[case]
    args = ragged_layout(chains, prefixes, 4, 2, 32, page_size, dtype, device, seed=case)
    got = ragged_verify_attention_triton(*args)
    ref = ragged_verify_attention_reference(*args)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.float(), ref.float(), **tol)


def test_reference_matches_sdpa_with_explicit_mask():
    chains, prefixes = CASES[0]
    q, k, v, qo, kvp, indices, kv_lens = ragged_layout(chains, prefixes, 6, 2, 16, 4, torch.float32, "cpu", seed=3)
    out = ragged_verify_attention_reference(q, k, v, qo, kvp, indices, kv_lens)
    k_flat, v_flat = k.reshape(-1, 2, 16), v.reshape(-1, 2, 16)
    for r, (n, prefix) in enumerate(zip(chains, prefixes)):
        if n == 0:
            continue
        pos = torch.arange(prefix + n)
        slots = indices[kvp[r]:kvp[r + 1]].long()[pos // 4] * 4 + pos % 4
        kr = k_flat[slots].repeat_interleave(3, dim=1).transpose(0, 1)  # [H, kv, hd]
        vr = v_flat[slots].repeat_interleave(3, dim=1).transpose(0, 1)
        qr = q[qo[r]:qo[r + 1]].transpose(0, 1)  # [H, n, hd]
        mask = torch.ones(n, prefix + n, dtype=torch.bool).tril(diagonal=prefix)
        want = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask)
        torch.testing.assert_close(out[qo[r]:qo[r + 1]], want.transpose(0, 1), rtol=1e-5, atol=1e-5)
    # a different chain split of the same cache gives different rows: the mask matters
    assert not torch.allclose(out[qo[3]], out[qo[3] + 1])


def test_pad_verify_layout_keeps_live_rows_and_fills_the_bucket():
    """The padding FlashInferRaggedVerify plans with must leave live rows' attention unchanged."""
    chains, prefixes, ps = [3, 1, 5], [6, 0, 17], 4
    q, k, v, qo, kvp, indices, kv_lens = ragged_layout(chains, prefixes, 4, 2, 16, ps, torch.float32, "cpu", seed=6)
    num_slots, num_tokens = 6, 24
    qo_p, kvp_p, idx_p, last_p, live_tokens = pad_verify_layout(qo, kvp, indices, kv_lens, num_slots, num_tokens, ps)
    assert live_tokens == 9 and int(qo_p[-1]) == num_tokens
    assert qo_p.numel() == num_slots + 2 and kvp_p.numel() == num_slots + 2 and last_p.numel() == num_slots + 1
    assert int(kvp_p[-1]) == idx_p.numel()
    assert torch.all((last_p >= 1) & (last_p <= ps))
    lens_p = (kvp_p[1:] - kvp_p[:-1] - 1) * ps + last_p  # FlashInfer's kv length rule
    assert torch.equal(lens_p[:3], kv_lens) and torch.all(lens_p >= qo_p[1:] - qo_p[:-1])
    q_p = torch.cat([q, torch.randn(num_tokens - live_tokens, 4, 16)])
    out_p = ragged_verify_attention_reference(q_p, k, v, qo_p, kvp_p, idx_p, lens_p)
    out = ragged_verify_attention_reference(q, k, v, qo, kvp, indices, kv_lens)
    torch.testing.assert_close(out_p[:live_tokens], out)
    with pytest.raises(ValueError, match="exceeds the bucket"):
        pad_verify_layout(qo, kvp, indices, kv_lens, 2, num_tokens, ps)


def test_flashinfer_cuda_graph_matches_reference():
    cuda_flashinfer_or_skip()
    from dspark_kernels import FlashInferRaggedVerify

    H, Hkv, hd, ps, slots, bucket_tokens = 8, 2, 128, 16, 8, 64
    # capture on a full-bucket layout: FlashInfer fixes the maximum row count at the first plan
    full = ragged_layout([8] * slots, [40] * slots, H, Hkv, hd, ps, torch.bfloat16, "cuda", seed=0, spare_pages=64)
    q, k, v, qo, kvp, indices, kv_lens = full
    fiv = FlashInferRaggedVerify(bucket_tokens, slots, max_pages=int(kvp[-1]) + slots + 64, num_qo_heads=H,
                                 num_kv_heads=Hkv, head_dim=hd, page_size=ps, dtype=torch.bfloat16)
    fiv.stage(qo.cpu(), kvp.cpu(), indices, kv_lens.cpu())
    fiv.capture_graph(k, v)
    torch.testing.assert_close(fiv.replay(q).float(), ragged_verify_attention_reference(*full).float(),
                               rtol=2e-2, atol=2e-2)

    # live steps: fewer requests, ragged chains, other prefixes, same cache pages -> re-stage, replay
    for seed, chains, prefixes in ((1, [1, 8, 3, 5, 2], [3, 70, 16, 33, 0]), (2, [4, 4, 1], [120, 1, 47])):
        # pages drawn over the captured cache (its own k / v are not used)
        q_l, _, _, qo_l, kvp_l, pages, lens = ragged_layout(chains, prefixes, H, Hkv, hd, ps, torch.bfloat16,
                                                             seed=seed, num_pages=k.shape[0])
        q_l, pages = q_l.cuda(), pages.cuda()
        live = (q_l, k, v, qo_l.cuda(), kvp_l.cuda(), pages, lens.cuda())
        fiv.stage(qo_l, kvp_l, pages, lens)
        got = fiv.replay(q_l).clone()
        ref = ragged_verify_attention_reference(*live)
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(fiv.run_eager(q_l, k, v).float(), ref.float(), rtol=2e-2, atol=2e-2)
        assert math.isfinite(got.float().abs().max().item())


@pytest.mark.gpu
def test_cuda_large_triton_matches_reference():
    device_or_skip("cuda", _KERNEL)
    chains = [8] * 32
    prefixes = [int(x) for x in torch.randint(1, 3000, (32,), generator=torch.Generator().manual_seed(0))]
    args = ragged_layout(chains, prefixes, 32, 8, 128, 16, torch.bfloat16, "cuda", seed=4)
    got = ragged_verify_attention_triton(*args, max_qo_len=8)
    torch.testing.assert_close(got.float(), ragged_verify_attention_reference(*args).float(), rtol=2e-2,
                               atol=2e-2)
