"""dspark_kernels/cpu_rotary.py and its hook (sglang_plugin/cpu_rotary.py): bit-identical to SGLang's own torch rotary
path, on SGLang's real RotaryEmbedding, for the shapes and strides the decoder layers pass."""

import importlib

import pytest
import torch

from dspark_kernels import cpu_rotary
from sglang_dspark.sglang_plugin import cpu_rotary as rotary_hook


def _kernel_or_skip():
    fn, reason = cpu_rotary.load()
    if fn is None:
        print(f"CPU rotary kernel unavailable here: {reason}")
        pytest.skip(f"CPU rotary kernel unavailable: {reason}")


def _rope(dtype, head_size=64, rotary_dim=64, base=1000000.0):
    """SGLang's RotaryEmbedding with its CPU-engine state (cache in the model dtype, the plain apply function), set
    up without its __init__, whose device checks read SGLANG_USE_CPU_ENGINE at SGLang's import time."""
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

    rope = RotaryEmbedding.__new__(RotaryEmbedding)
    torch.nn.Module.__init__(rope)
    rope.head_size, rope.rotary_dim, rope.max_position_embeddings = head_size, rotary_dim, 4096
    rope.base, rope.is_neox_style, rope.dtype, rope._force_native = base, True, dtype, False
    rope.position_start = 0
    rope.register_buffer("cos_sin_cache", rope._compute_cos_sin_cache().to(dtype), persistent=False)
    rope._apply_rotary_emb_wrapped = apply_rotary_emb
    return rope


def _qkv(tokens, hq, hk, d, dtype, seed):
    """q and k as the decoder passes them: column slices of one fused qkv output (row stride = its width)."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(tokens, (hq + 2 * hk) * d, generator=g) * 8).to(dtype)
    return qkv[:, : hq * d], qkv[:, hq * d: (hq + hk) * d]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens,rotary_dim", [(1, 64), (8, 64), (37, 32)])
def test_matches_sglangs_torch_path_bit_for_bit(dtype, tokens, rotary_dim):
    _kernel_or_skip()
    rope = _rope(dtype, rotary_dim=rotary_dim)
    q, k = _qkv(tokens, 14, 2, 64, dtype, seed=tokens)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(7))
    want_q, want_k = rope.forward_native(positions, q, k)  # the class method as SGLang ships it (no hook here)
    got = cpu_rotary.rotary_neox(positions, q, k, rope.cos_sin_cache, rope.head_size, rope.rotary_dim)
    assert got is not None
    assert got[0].shape == want_q.shape and got[1].shape == want_k.shape
    assert torch.equal(got[0], want_q) and torch.equal(got[1], want_k)
    assert not torch.equal(got[0], q)  # it did rotate


def test_declines_what_it_does_not_handle():
    _kernel_or_skip()
    rope = _rope(torch.bfloat16)
    q, k = _qkv(3, 2, 1, 64, torch.bfloat16, seed=1)
    pos = torch.tensor([0, 5, 9])
    cache = rope.cos_sin_cache
    assert cpu_rotary.rotary_neox(pos, q.half(), k.half(), cache.half(), 64, 64) is None  # fp16
    assert cpu_rotary.rotary_neox(pos, q, k, cache.float(), 64, 64) is None  # cache of another dtype
    assert cpu_rotary.rotary_neox(pos, q[:, ::2], k, cache, 64, 64) is None  # strided rows
    assert cpu_rotary.rotary_neox(torch.tensor([0, 5, 4096]), q, k, cache, 64, 64) is None  # past the cache


def test_the_hook_takes_neox_calls_and_leaves_the_rest_to_sglang(monkeypatch):
    _kernel_or_skip()
    rope = _rope(torch.bfloat16)
    q, k = _qkv(4, 14, 2, 64, torch.bfloat16, seed=2)
    pos = torch.arange(4) + 100
    calls = []

    def original(r, *args):
        calls.append(args)
        return "sglang"

    want = type(rope).forward_native(rope, pos, q, k)
    got = rotary_hook.around_forward_native(original, rope, pos, q, k)
    assert calls == [] and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert rotary_hook.around_forward_native(original, rope, pos, q, k, offsets=pos) == "sglang"
    rope.is_neox_style = False
    assert rotary_hook.around_forward_native(original, rope, pos, q, k) == "sglang"
    rope.is_neox_style = True
    monkeypatch.setenv(rotary_hook.DISABLE_ENV, "1")
    assert rotary_hook.around_forward_native(original, rope, pos, q, k) == "sglang" and len(calls) == 3


def test_hook_target_exists_in_the_installed_sglang():
    targets = []
    rotary_hook.register(type("Registry", (), {"register": staticmethod(lambda t, fn, kind: targets.append(t))}),
                         type("HookType", (), {"AFTER": "after", "AROUND": "around"}))
    module, cls, attr = targets[0].rsplit(".", 2)
    assert callable(getattr(getattr(importlib.import_module(module), cls), attr))
