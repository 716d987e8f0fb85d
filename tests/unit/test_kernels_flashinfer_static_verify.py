"""FlashInfer ragged verify planned once per bucket: the layout math on CPU, the real kernel on a GPU.

On CPU, FlashInfer's FA2 paged-prefill semantics (what the plan fixes, what it reads live) are emulated, so the
buffers and the gather FlashInferStaticVerify builds are checked against the reference attention without a GPU.
On CUDA with FlashInfer the class itself runs, and plan() is booby-trapped after construction.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # repo root: the dspark_kernels/ package

from dspark_kernels import ragged_verify_attention_reference  # noqa: E402
from dspark_kernels.flashinfer_static_verify import static_verify_layout  # noqa: E402
from tests.kernel_checks import cuda_flashinfer_or_skip, ragged_layout  # noqa: E402


def _live(chains, prefixes, page_size, H=4, Hkv=2, hd=16, num_pages=None, dtype=torch.float32, seed=0):
    return ragged_layout(chains, prefixes, H, Hkv, hd, page_size, dtype, seed=seed, spare_pages=4,
                         num_pages=num_pages)


def _emulate_fa2_static(q_buf, k, v, qo_b, kvp_b, idx_b, last_b, width, page_size):
    """What FA2 with a full-width plan does: request s reads its queries and kv length LIVE (qo_indptr,
    kv_indptr, last_page_len) and writes its rows at the PLANNED offset s * width."""
    out = torch.full_like(q_buf, float("nan"))
    for s in range(len(last_b)):
        n = int(qo_b[s + 1] - qo_b[s])
        pages = int(kvp_b[s + 1] - kvp_b[s])
        kv_len = 0 if pages == 0 else (pages - 1) * page_size + int(last_b[s])
        assert n <= width and kv_len >= n
        if n == 0:
            continue
        one = ragged_verify_attention_reference(
            q_buf[int(qo_b[s]):int(qo_b[s + 1])], k, v, torch.tensor([0, n], dtype=torch.int32),
            torch.tensor([0, pages], dtype=torch.int32), idx_b[int(kvp_b[s]):int(kvp_b[s + 1])],
            torch.tensor([kv_len], dtype=torch.int32))
        out[s * width:s * width + n] = one
    return out


@pytest.mark.parametrize("chains,prefixes,slots,page_size", [
    ([1, 4, 0, 8, 2], [5, 0, 7, 20, 13], 8, 4),
    ([8, 8, 8], [3, 40, 1], 3, 16),  # full bucket, full width
    ([3], [0], 5, 1),
    ([], [], 4, 8),  # nothing live
])
def test_static_layout_through_emulated_fa2_matches_reference(chains, prefixes, slots, page_size):
    width = 8
    q, k, v, qo, kvp, pages, lens = _live(chains, prefixes, page_size, seed=len(chains))
    qo_b, kvp_b, last_b, gather, live_pages, live_tokens = static_verify_layout(
        qo.numpy(), kvp.numpy(), lens.numpy(), slots, width, page_size)
    assert live_tokens == int(qo[-1]) and live_pages == int(kvp[-1])
    assert qo_b.shape == (slots + 1,) and kvp_b.shape == (slots + 1,) and last_b.shape == (slots,)
    assert np.all((last_b >= 1) & (last_b <= page_size))
    idx_b = torch.cat([pages, torch.zeros(int(kvp_b[-1]) - live_pages, dtype=torch.int32)])
    q_buf = torch.cat([q, torch.randn(slots * width - live_tokens, *q.shape[1:])])  # stale rows past the live
    strided = _emulate_fa2_static(q_buf, k, v, qo_b, kvp_b, idx_b, last_b, width, page_size)
    got = strided[torch.from_numpy(gather).long()][:live_tokens]
    want = ragged_verify_attention_reference(q, k, v, qo, kvp, pages, lens)
    torch.testing.assert_close(got, want)
    assert len(set(gather[:live_tokens].tolist())) == live_tokens  # no two live rows share an output row


def test_gather_is_what_makes_it_right():
    """Reading the strided output as if it were packed (no gather) is wrong as soon as a chain is short."""
    width, slots, ps = 8, 4, 4
    q, k, v, qo, kvp, pages, lens = _live([2, 5, 3], [6, 1, 9], ps, seed=9)
    qo_b, kvp_b, last_b, gather, live_pages, live_tokens = static_verify_layout(
        qo.numpy(), kvp.numpy(), lens.numpy(), slots, width, ps)
    idx_b = torch.cat([pages, torch.zeros(int(kvp_b[-1]) - live_pages, dtype=torch.int32)])
    q_buf = torch.cat([q, torch.zeros(slots * width - live_tokens, *q.shape[1:])])
    strided = _emulate_fa2_static(q_buf, k, v, qo_b, kvp_b, idx_b, last_b, width, ps)
    want = ragged_verify_attention_reference(q, k, v, qo, kvp, pages, lens)
    assert not torch.allclose(strided[:live_tokens].nan_to_num(), want)
    torch.testing.assert_close(strided[torch.from_numpy(gather).long()][:live_tokens], want)


def test_static_layout_rejects_what_the_plan_cannot_cover():
    _, _, _, qo, kvp, _, lens = _live([3, 9], [4, 4], 4)
    with pytest.raises(ValueError, match="exceeds the bucket's width 8"):
        static_verify_layout(qo.numpy(), kvp.numpy(), lens.numpy(), 4, 8, 4)
    _, _, _, qo, kvp, _, lens = _live([3, 2, 1], [4, 4, 4], 4)
    with pytest.raises(ValueError, match="exceed the bucket's 2 slots"):
        static_verify_layout(qo.numpy(), kvp.numpy(), lens.numpy(), 2, 8, 4)
    with pytest.raises(ValueError, match="kv length must cover"):
        static_verify_layout(qo.numpy(), kvp.numpy(), np.array([4, 1, 4], dtype=np.int32), 4, 8, 4)


def test_flashinfer_static_plan_once_replays_ragged_steps():
    cuda_flashinfer_or_skip()
    from dspark_kernels.flashinfer_static_verify import FlashInferStaticVerify

    H, Hkv, hd, ps, slots, width, num_pages = 8, 2, 128, 16, 8, 8, 96
    fsv = FlashInferStaticVerify(slots, width, max_pages=num_pages, num_qo_heads=H, num_kv_heads=Hkv,
                                 head_dim=hd, page_size=ps, dtype=torch.bfloat16)

    def no_replan(*args, **kwargs):
        raise AssertionError("plan() called after construction")

    fsv.wrapper.plan = no_replan
    steps = [([8] * slots, [40] * slots), ([1, 8, 3, 0, 2], [3, 70, 16, 9, 0]), ([4, 4, 1], [120, 1, 47]),
             ([7], [600])]
    k_cache = torch.zeros(num_pages, ps, Hkv, hd, dtype=torch.bfloat16, device="cuda")  # captured addresses
    v_cache = torch.zeros_like(k_cache)
    for step, (chains, prefixes) in enumerate(steps):
        q, k, v, qo, kvp, pages, lens = _live(chains, prefixes, ps, H, Hkv, hd, num_pages, torch.bfloat16,
                                              seed=step)
        k_cache.copy_(k), v_cache.copy_(v)
        k_cache[0].zero_(), v_cache[0].zero_()  # page 0 backs the unused slots' dummy page: finite
        q, pages = q.cuda(), pages.cuda()
        fsv.stage(qo, kvp, pages, lens)
        if fsv.graph is None:
            fsv.capture_graph(k_cache, v_cache)
        ref = ragged_verify_attention_reference(q, k_cache, v_cache, qo.cuda(), kvp.cuda(), pages, lens.cuda())
        got = fsv.replay(q).clone()
        torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(fsv.run_eager(q, k_cache, v_cache).float(), ref.float(), rtol=2e-2,
                                   atol=2e-2)
    assert fsv.plans == 1
