"""Unit tests for patches/: the sgl_kernel CPU stand-in ops and scripts/apply_patches.py.

Each op is checked against a naive reference written here (loops over the
documented semantics) or, for attention, against sglang's own pure-torch
fallback (TorchNativeAttnBackend's SDPA path).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sgl_kernel = pytest.importorskip("sgl_kernel")
if not getattr(sgl_kernel, "IS_CPU_STANDIN", False):
    pytest.skip("a real sgl_kernel is installed; these tests cover the CPU stand-in", allow_module_level=True)

from sgl_kernel import attention, kvcache, spec_ops  # noqa: E402
from sgl_kernel.speculative import reconstruct_indices_from_tree_mask  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ package surface
def test_unknown_op_imports_but_fails_loudly_when_called():
    from sgl_kernel import some_cuda_only_op

    with pytest.raises(NotImplementedError, match="some_cuda_only_op"):
        some_cuda_only_op(torch.zeros(1))


def test_unknown_submodules_raise_import_error():
    # sglang.srt.layers.quantization.utils relies on this ImportError to use its own scalar types
    with pytest.raises(ImportError):
        from sgl_kernel.scalar_type import scalar_types  # noqa: F401
    with pytest.raises(AttributeError):
        sgl_kernel.__no_such_dunder__


def test_torch_ops_registered_without_amx_markers():
    assert callable(torch.ops.sgl_kernel.decode_attention_cpu)
    assert callable(torch.ops.sgl_kernel.extend_attention_cpu)
    # sglang turns on its AMX weight-packing paths when this op exists; it must not.
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")


# ------------------------------------------------------------------ kv cache ops
def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer():
    torch.manual_seed(0)
    buffers = [torch.randn(10, 2, 4), torch.randn(10, 2, 4), torch.randn(10, 3).to(torch.bfloat16)]
    expected = [b.clone() for b in buffers]
    tgt, src = torch.tensor([1, 5, 2]), torch.tensor([5, 7, 1])  # overlapping: 5 and 1 are both src and tgt
    for e in expected:
        e[tgt] = e[src].clone()
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])
    kvcache.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for got, want in zip(buffers, expected):
        assert torch.equal(got, want)


def test_assign_req_to_token_pool_and_extend_cache_locs_are_inverse():
    req_to_token = torch.zeros(4, 12, dtype=torch.int32)
    rows, start, end = torch.tensor([2, 0]), torch.tensor([3, 0]), torch.tensor([6, 2])
    locs = torch.tensor([11, 12, 13, 21, 22], dtype=torch.int64)
    kvcache.assign_req_to_token_pool_cpu(rows, req_to_token, start, end, locs, 12)
    assert req_to_token[2, 3:6].tolist() == [11, 12, 13]
    assert req_to_token[0, 0:2].tolist() == [21, 22]
    assert int(req_to_token.count_nonzero()) == 5

    out = torch.full((5,), -1, dtype=torch.int64)
    spec_ops.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, out, 12)
    assert torch.equal(out, locs)


def test_assign_draft_cache_locs_contiguous():
    req_to_token = torch.arange(3 * 20, dtype=torch.int32).view(3, 20)
    rows, seq_lens = torch.tensor([2, 1]), torch.tensor([5, 9])
    topk, steps = 2, 3
    out = torch.empty(2 * topk * steps, dtype=torch.int64)
    spec_ops.assign_draft_cache_locs_contiguous_cpu(rows, req_to_token, seq_lens, out, 20, topk, steps)
    want = torch.cat([req_to_token[2, 5:11], req_to_token[1, 9:15]]).long()
    assert torch.equal(out, want)


def test_build_draft_decode_metadata():
    req_to_token = torch.randperm(3 * 16, dtype=torch.int32).view(3, 16)
    rows, seq_lens, topk, steps = torch.tensor([1, 2]), torch.tensor([4, 6]), 2, 3
    out = spec_ops.build_draft_decode_metadata_cpu(req_to_token, rows, seq_lens, topk, steps, 16)
    assert out.shape == (4, 16) and out.dtype == req_to_token.dtype
    for b in range(2):
        r, sl = int(rows[b]), int(seq_lens[b])
        for k in range(topk):
            want = torch.cat([req_to_token[r, :sl], req_to_token[r, sl + k * steps : sl + (k + 1) * steps]])
            assert torch.equal(out[b * topk + k, : sl + steps], want)


def test_fill_bonus_tokens_and_accept_out_cache_loc():
    accept_tokens = torch.tensor([[5, 6, 7], [8, 9, 10]])
    bonus = torch.zeros(2, dtype=torch.int64)
    spec_ops.fill_bonus_tokens_cpu(accept_tokens, torch.tensor([2, 3]), bonus, 3)
    assert bonus.tolist() == [6, 10]

    accept_index = torch.tensor([[0, 2, -1], [3, -1, -1]])
    out_cache_loc = torch.tensor([100, 101, 102, 103, 104])
    out = torch.full((6,), -7, dtype=torch.int64)
    spec_ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, out)
    assert out.tolist() == [100, 102, 103, -7, -7, -7]


def test_rotate_input_ids():
    ids = torch.tensor([1, 2, 3, 4, 5, 6])
    spec_ops.rotate_input_ids_cpu(ids, torch.tensor([0, 3]), torch.tensor([3, 3]), torch.tensor([70, 80]), None)
    assert ids.tolist() == [2, 3, 70, 5, 6, 80]
    ids = torch.tensor([1, 2, 3, 4])
    spec_ops.rotate_input_ids_cpu(ids, torch.tensor([0]), torch.tensor([4]), torch.tensor([9]), torch.tensor([1]))
    assert ids.tolist() == [2, 9, 4, 4]


# ------------------------------------------------------------------ EAGLE tree
# topk=2, steps=2: candidates 0,1 are root children; 2,3 children of cand 0 (beam 1);
# 4,5 children of cand 1 (beam 2). Selecting [0, 1, 2, 4] gives nodes 1..4 with
# parents 0, 0, 1, 2.
TREE_PARENT_LIST = torch.tensor([[-1, 0, 1]])
TREE_SELECTED = torch.tensor([[0, 1, 2, 4]])
TREE_QLEN_MASK = [
    [1, 0, 0, 0, 0],
    [1, 1, 0, 0, 0],
    [1, 0, 1, 0, 0],
    [1, 1, 0, 1, 0],
    [1, 0, 1, 0, 1],
]


def _build_tree(parent_list, selected, seq_lens, mode, n=5, topk=2, depth=2):
    bs = seq_lens.numel()
    if mode == spec_ops.FULL_MASK:
        mask = torch.ones(int(seq_lens.sum()) * n + n * n * bs, dtype=torch.bool)
    else:
        mask = torch.ones(bs * n * n, dtype=torch.bool)
    positions = torch.empty(bs * n, dtype=torch.long)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
    spec_ops.build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, mask, positions, retrieve[0], retrieve[1], retrieve[2], topk, depth, n, mode
    )
    return mask, positions, retrieve


def test_build_tree_qlen_only_by_hand():
    mask, positions, (ridx, nxt, sib) = _build_tree(TREE_PARENT_LIST, TREE_SELECTED, torch.tensor([7]), spec_ops.QLEN_ONLY)
    assert mask.view(5, 5).int().tolist() == TREE_QLEN_MASK
    assert positions.tolist() == [7, 8, 8, 9, 9]
    assert ridx.tolist() == [[0, 1, 2, 3, 4]]
    assert nxt.tolist() == [[1, 3, 4, -1, -1]]
    assert sib.tolist() == [[-1, 2, -1, -1, -1]]


def test_build_tree_full_mask_layout_two_requests():
    parents = TREE_PARENT_LIST.repeat(2, 1)
    selected = torch.tensor([[0, 1, 2, 4], [1, 0, 5, 3]])  # request 1: nodes 1,2 = cand 1,0; 3 -> cand5 (beam2 = cand1 = node1)
    seq_lens = torch.tensor([3, 2])
    mask, positions, (_, nxt, sib) = _build_tree(parents, selected, seq_lens, spec_ops.FULL_MASK)
    n = 5
    first = mask[: n * (3 + n)].view(n, 3 + n)
    assert first[:, :3].all()  # prefix columns untouched (caller's fill)
    assert first[:, 3:].int().tolist() == TREE_QLEN_MASK
    second = mask[n * (3 + n) :].view(n, 2 + n)
    assert second[:, 2:].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],  # cand 5 comes from cand 1 = node 1
        [1, 0, 1, 0, 1],  # cand 3 comes from cand 0 = node 2
    ]
    assert positions.tolist() == [3, 4, 4, 5, 5, 2, 3, 3, 4, 4]
    assert nxt[1].tolist() == [1, 3, 4, -1, -1] and sib[1].tolist() == [-1, 2, -1, -1, -1]


def test_build_tree_bitpacking_is_loud():
    with pytest.raises(NotImplementedError):
        _build_tree(TREE_PARENT_LIST, TREE_SELECTED, torch.tensor([7]), spec_ops.QLEN_ONLY_BITPACKING)


def _naive_reconstruct(mask: torch.Tensor, seq_len: int):
    n = mask.shape[0]
    anc = [[j for j in range(i) if mask[i, j]] for i in range(n)]
    parent = [max(a) if a else -1 for a in anc]
    positions = [len(a) + seq_len for a in anc]
    first_child = [next((k for k in range(t + 1, n) if t in anc[k]), -1) for t in range(n)]
    sibling = [
        next((k for k in range(t + 1, n) if parent[k] == parent[t]), -1) if parent[t] >= 0 else -1 for t in range(n)
    ]
    return positions, first_child, sibling


def _random_tree_mask(n: int, gen: torch.Generator) -> torch.Tensor:
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    return mask


def test_reconstruct_indices_from_tree_mask_matches_naive_and_tree_builder():
    gen = torch.Generator().manual_seed(1)
    bs, n = 3, 6
    masks = torch.stack([_random_tree_mask(n, gen) for _ in range(bs)])
    seq_lens = torch.tensor([4, 0, 9])
    positions = torch.empty(bs * n, dtype=torch.long)
    ridx, nxt, sib = (torch.empty(bs, n, dtype=torch.long) for _ in range(3))
    reconstruct_indices_from_tree_mask(masks.flatten(), seq_lens, positions, ridx, nxt, sib, bs, n)
    for b in range(bs):
        pos, child, sibling = _naive_reconstruct(masks[b], int(seq_lens[b]))
        assert positions.view(bs, n)[b].tolist() == pos
        assert ridx[b].tolist() == list(range(b * n, (b + 1) * n))
        assert nxt[b].tolist() == child
        assert sib[b].tolist() == sibling

    # The EAGLE tree builder and the NGRAM reconstruction agree on the same tree.
    mask, positions, (_, want_next, want_sib) = _build_tree(TREE_PARENT_LIST, TREE_SELECTED, torch.tensor([7]), spec_ops.QLEN_ONLY)
    pos2, ridx2, nxt2, sib2 = torch.empty(5, dtype=torch.long), *(torch.empty(1, 5, dtype=torch.long) for _ in range(3))
    reconstruct_indices_from_tree_mask(mask, torch.tensor([7]), pos2, ridx2, nxt2, sib2, 1, 5)
    assert torch.equal(pos2, positions) and torch.equal(nxt2, want_next) and torch.equal(sib2, want_sib)


def _naive_verify_greedy(cands, nxt, sib, target, steps):
    """Walk down from the root, picking the child whose token equals the target at the current node."""
    path, node = [0], 0
    while len(path) < steps:
        child = nxt[node]
        while child != -1 and cands[child] != target[node]:
            child = sib[child]
        if child == -1:
            break
        path.append(child)
        node = child
    return path


def test_verify_tree_greedy_by_hand_and_random():
    _, _, (ridx, nxt, sib) = _build_tree(TREE_PARENT_LIST, TREE_SELECTED, torch.tensor([7]), spec_ops.QLEN_ONLY)
    # tokens: root 50, node1 61, node2 62, node3 63, node4 64; target picks node2 then node4, bonus 99
    candidates = torch.tensor([[50, 61, 62, 63, 64]])
    target = torch.tensor([[62, 0, 64, 0, 99]])
    predicts = torch.full((5,), -1, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    spec_ops.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
        retrive_index=ridx, retrive_next_token=nxt, retrive_next_sibling=sib, target_predict=target,
    )
    assert accept_index.tolist() == [[0, 2, 4]] and accept_num.tolist() == [2]
    assert predicts.tolist() == [62, -1, 64, -1, 99]

    gen = torch.Generator().manual_seed(3)
    bs, n, steps = 4, 6, 4
    masks = torch.stack([_random_tree_mask(n, gen) for _ in range(bs)])
    positions, ridx, nxt, sib = torch.empty(bs * n, dtype=torch.long), *(torch.empty(bs, n, dtype=torch.long) for _ in range(3))
    reconstruct_indices_from_tree_mask(masks.flatten(), torch.zeros(bs, dtype=torch.long), positions, ridx, nxt, sib, bs, n)
    candidates = torch.randint(0, 3, (bs, n), generator=gen)
    target = torch.randint(0, 3, (bs, n), generator=gen)
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    spec_ops.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
        retrive_index=ridx, retrive_next_token=nxt, retrive_next_sibling=sib, target_predict=target,
    )
    for b in range(bs):
        path = _naive_verify_greedy(candidates[b].tolist(), nxt[b].tolist(), sib[b].tolist(), target[b].tolist(), steps)
        assert int(accept_num[b]) == len(path) - 1
        assert accept_index[b, : len(path)].tolist() == [b * n + p for p in path]
        assert predicts[b * n + path[-1]] == target[b, path[-1]]


# ------------------------------------------------------------------ attention
@pytest.fixture(scope="module")
def torch_native():
    """sglang's pure-torch SDPA attention (no __init__ needed for the _run_sdpa_* helpers)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    return TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)


def _paged_kv(num_slots=64, kv_heads=2, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_slots, kv_heads, dim, generator=gen), torch.randn(num_slots, kv_heads, dim, generator=gen)


def test_decode_attention_matches_sglang_sdpa_and_writes_kv(torch_native):
    torch.manual_seed(0)
    k_cache, v_cache = _paged_kv()
    heads, dim, bs = 4, 8, 2
    req_to_token = torch.zeros(3, 32, dtype=torch.int32)
    req_to_token[1, :5] = torch.tensor([3, 9, 4, 20, 33])
    req_to_token[2, :3] = torch.tensor([40, 41, 50])
    rows, seq_lens = torch.tensor([1, 2]), torch.tensor([5, 3])
    loc = torch.tensor([33, 50])  # each request's newest token
    q = torch.randn(bs, heads, dim)
    new_k, new_v = torch.randn(bs, 2, dim), torch.randn(bs, 2, dim)
    out = torch.empty(bs, heads, dim)
    torch.ops.sgl_kernel.decode_attention_cpu(
        q, k_cache, v_cache, 1.0, 1.0, out, new_k, new_v, loc, torch.zeros(bs, heads, 8, dim + 1),
        req_to_token, rows, seq_lens, 0.35, 0.0, False, 0, None, None,
    )
    assert torch.equal(k_cache[loc], new_k) and torch.equal(v_cache[loc], new_v)
    want = torch.empty(bs, heads, dim)
    torch_native._run_sdpa_forward_decode(
        q, want, k_cache, v_cache, req_to_token, rows, seq_lens, scaling=0.35, enable_gqa=True, causal=False
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_extend_attention_causal_matches_sglang_sdpa(torch_native):
    torch.manual_seed(1)
    k_cache, v_cache = _paged_kv(seed=1)
    heads, dim = 4, 8
    req_to_token = torch.zeros(2, 16, dtype=torch.int32)
    req_to_token[0, :6] = torch.arange(10, 16)
    req_to_token[1, :4] = torch.tensor([30, 2, 31, 7])
    rows = torch.tensor([0, 1])
    seq_lens, ext = torch.tensor([6, 4]), torch.tensor([3, 4])  # request 0 has a 3-token prefix
    starts = torch.tensor([0, 3])
    q = torch.randn(7, heads, dim)
    out = torch.empty(7, heads, dim)
    torch.ops.sgl_kernel.extend_attention_cpu(
        q, None, None, out, k_cache, v_cache, 1.0, 1.0, req_to_token, rows, seq_lens, ext, starts, 4,
        0.3, 0.0, False, 0, None, None, None, True,
    )
    want = torch.empty(7, heads, dim)
    torch_native._run_sdpa_forward_extend(
        q, want, k_cache, v_cache, req_to_token, rows, seq_lens, seq_lens - ext, ext,
        scaling=0.3, enable_gqa=True, causal=True,
    )
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)

    # k_extend/v_extend given: used for the new tokens instead of the cache rows
    k_new = torch.randn(7, 2, dim)
    out2 = torch.empty_like(out)
    torch.ops.sgl_kernel.extend_attention_cpu(
        q, k_new, v_cache[req_to_token[0, :1].long()].expand(7, 2, dim).clone(), out2, k_cache, v_cache, 1.0, 1.0,
        req_to_token, rows, seq_lens, ext, starts, 4, 0.3, 0.0, False, 0, None, None, None, True,
    )
    assert not torch.allclose(out2, out)


def _naive_attention(q, k, v, visible, scale, logit_cap=0.0, sinks=None):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1])
    for h in range(q.shape[1]):
        s = q[:, h] @ k[:, h].T * scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        s = s.masked_fill(~visible, float("-inf"))
        w = torch.exp(s - s.max(dim=1, keepdim=True).values)
        denom = w.sum(1, keepdim=True)
        if sinks is not None:
            denom = denom + torch.exp(sinks[h] - s.max(dim=1, keepdim=True).values)
        out[:, h] = (w / denom) @ v[:, h]
    return out


def test_extend_attention_tree_mask_sinks_logit_cap():
    torch.manual_seed(2)
    k_cache, v_cache = _paged_kv(seed=2)
    heads, dim, n, prefix = 4, 8, 5, 3
    req_to_token = torch.arange(16, dtype=torch.int32).view(1, 16) + 20
    seq_lens, ext, starts = torch.tensor([prefix + n]), torch.tensor([n]), torch.tensor([0])
    tree = torch.tensor(TREE_QLEN_MASK, dtype=torch.bool)
    q = torch.randn(n, heads, dim)
    sinks = torch.randn(heads)
    out = torch.empty(n, heads, dim)
    torch.ops.sgl_kernel.extend_attention_cpu(
        q, None, None, out, k_cache, v_cache, 1.0, 1.0, req_to_token, torch.tensor([0]), seq_lens, ext, starts, n,
        0.4, 2.0, False, 0, None, sinks, tree.flatten(), True,
    )
    slots = req_to_token[0, : prefix + n].long()
    visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool), tree], dim=1)
    want = _naive_attention(q, k_cache[slots], v_cache[slots], visible, 0.4, logit_cap=2.0, sinks=sinks)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_decode_attention_sliding_window():
    torch.manual_seed(3)
    k_cache, v_cache = _paged_kv(seed=3)
    req_to_token = torch.arange(32, dtype=torch.int32).view(1, 32)
    q = torch.randn(1, 4, 8)
    out = torch.empty(1, 4, 8)
    torch.ops.sgl_kernel.decode_attention_cpu(
        q, k_cache, v_cache, 1.0, 1.0, out, None, None, None, torch.empty(0), req_to_token,
        torch.tensor([0]), torch.tensor([10]), 0.5, 0.0, False, 4, None, None,
    )
    visible = torch.ones(1, 4, dtype=torch.bool)  # window 4 = the last 4 tokens, the query's own included
    want = _naive_attention(q, k_cache[6:10], v_cache[6:10], visible, 0.5)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ apply_patches.py
def _load_apply_patches():
    spec = importlib.util.spec_from_file_location("apply_patches", REPO / "scripts" / "apply_patches.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(shutil.which("patch") is None, reason="needs the patch program")
def test_apply_diff_idempotent_and_loud_on_drift(tmp_path, monkeypatch):
    ap = _load_apply_patches()
    name, target = "torchvision_meta_guard.diff", "torchvision/__init__.py"
    installed = ap.site_packages() / target
    if not installed.is_file():
        pytest.skip("torchvision not installed")
    # Rebuild the pristine upstream file in a fake site-packages (reverse of our patch if applied).
    fake = tmp_path / "site"
    (fake / "torchvision").mkdir(parents=True)
    shutil.copy(installed, fake / target)
    subprocess.run(
        ["patch", "-p1", "--reverse", "--batch", "--silent", "-d", str(fake), "-i", str(ap.PATCHES / name)],
        capture_output=True,
    )
    pristine = (fake / target).read_text()
    assert "_has_ops()" not in pristine
    monkeypatch.setattr(ap, "site_packages", lambda: fake)

    assert ap.apply_diff(name, check=True) is False  # reports, changes nothing
    assert (fake / target).read_text() == pristine
    assert ap.apply_diff(name, check=False) is True
    patched = (fake / target).read_text()
    assert "if extension._has_ops():" in patched
    assert ap.apply_diff(name, check=False) is True  # second run: already applied, no change
    assert (fake / target).read_text() == patched

    (fake / target).write_text(pristine.replace("_autograd_registrations", "_renamed_upstream"))
    with pytest.raises(ap.PatchError, match=name):
        ap.apply_diff(name, check=False)


def test_patch_files_have_a_header_and_target_existing_files():
    ap = _load_apply_patches()
    for name, target in ap.DIFFS.items():
        text = (ap.PATCHES / name).read_text()
        assert text.startswith("# "), f"{name} needs a comment header"
        assert f"--- a/{target}" in text and f"+++ b/{target}" in text


def test_apply_patches_check_passes_on_this_venv():
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "apply_patches.py"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
