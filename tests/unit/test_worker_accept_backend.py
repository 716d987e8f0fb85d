"""The worker's greedy acceptance gives the same result through the Triton kernel (interpreter on CPU) and torch."""

import pytest
import torch

from dspark_kernels._rng import HAS_TRITON

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")


def test_greedy_accept_kernel_equals_torch_path():
    from sglang_dspark.sglang_plugin.worker import _dense_index, greedy_accept

    if torch.cuda.is_available():
        device = "cuda"
    else:
        import os

        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("CPU case needs TRITON_INTERPRET=1 (tests/conftest.py sets it when there is no CUDA)")
        device = "cpu"
    g = torch.Generator().manual_seed(0)
    bs, gamma, V = 9, 5, 50
    lens = torch.randint(0, gamma + 1, (bs,), generator=g)
    drafts = torch.randint(0, V, (bs, gamma), generator=g)
    dense = _dense_index(lens, gamma)
    packed = torch.randint(0, V, (int((lens + 1).sum()),), generator=g)
    # make long accepted prefixes likely: copy drafts into the target argmax for most rows
    rows = torch.repeat_interleave(torch.arange(bs), lens + 1)
    offs = torch.cat([torch.arange(int(n) + 1) for n in lens])
    copy = (offs < lens[rows]) & (rows % 3 != 0)
    packed[copy] = drafts[rows[copy], offs[copy]]
    ref = greedy_accept(drafts.to(device), lens, packed.to(device), dense, backend="torch")
    got = greedy_accept(drafts.to(device), lens, packed.to(device), dense, backend="triton")
    assert torch.equal(got.accept_lens.cpu(), ref.accept_lens.cpu())
    assert torch.equal(got.bonus_tokens.cpu(), ref.bonus_tokens.cpu())
    assert torch.equal(got.output_tokens.cpu(), ref.output_tokens.cpu())
    assert int(ref.accept_lens.sum()) > 0
