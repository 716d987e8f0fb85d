"""Ragged chain-verify attention: torch reference, Triton fallback kernel, FlashInfer CUDA-graph wrapper.

Problem. Request r verifies a chain of n_r = qo_indptr[r+1] - qo_indptr[r] tokens (anchor + drafts; 0 allowed
for padding slots) whose K/V are already written to the cache, so the cache holds kv_lens[r] tokens of which
the last n_r are the chain: prefix_r = kv_lens[r] - n_r. Query i of request r (packed row qo_indptr[r] + i)
attends to kv positions j < prefix_r + i + 1 (causal within the chain, everything before it), the same
bottom-right-aligned causal mask FlashInfer applies when qo_len < kv_len.

Cache layout (FlashInfer "NHD"): k_cache / v_cache are [num_pages, page_size, Hkv, hd] (paged) or
[num_slots, Hkv, hd] (flat, page_size 1). Request r's pages are kv_indices[kv_indptr[r] : kv_indptr[r+1]]
(kv_indptr counts PAGES: ceil(kv_lens[r] / page_size) per request); kv position j lives in page
kv_indices[kv_indptr[r] + j // page_size] at offset j % page_size. GQA: query head h reads kv head
h // (H // Hkv).
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from dspark_kernels._rng import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

try:
    import flashinfer

    HAS_FLASHINFER = True
    FLASHINFER_IMPORT_ERROR = ""
except Exception as exc:  # ImportError, or a CUDA-less build failing at import time
    HAS_FLASHINFER = False
    FLASHINFER_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"


def _flat_cache(cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """[num_pages, page_size, Hkv, hd] or [num_slots, Hkv, hd] -> ([slots, Hkv, hd] view, page_size)."""
    if cache.dim() == 4:
        return cache.reshape(-1, cache.shape[2], cache.shape[3]), cache.shape[1]
    if cache.dim() == 3:
        return cache, 1
    raise ValueError(f"cache must be [pages, page_size, Hkv, hd] or [slots, Hkv, hd]; got {tuple(cache.shape)}")


def kv_indptr_from_lens(kv_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    """Page-count prefix sum [R+1] (int32) for kv_lens [R]."""
    pages = (kv_lens.to(torch.int64) + page_size - 1) // page_size
    indptr = torch.zeros(kv_lens.numel() + 1, dtype=torch.int32, device=kv_lens.device)
    indptr[1:] = torch.cumsum(pages, 0)
    return indptr


# ------------------------------------------------------------------------------------------- reference


def ragged_verify_attention_reference(
    q_packed: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Per-request fp32 softmax attention; returns [T, H, hd] in q's dtype."""
    T, H, hd = q_packed.shape
    k_flat, page_size = _flat_cache(k_cache)
    v_flat, _ = _flat_cache(v_cache)
    hkv = k_flat.shape[1]
    group = H // hkv
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(hd)
    out = torch.zeros_like(q_packed)
    qo = qo_indptr.tolist()
    kvp = kv_indptr.tolist()
    lens = kv_lens.tolist()
    for r in range(len(lens)):
        n = qo[r + 1] - qo[r]
        if n == 0:
            continue
        kv_len = lens[r]
        prefix = kv_len - n
        if prefix < 0:
            raise ValueError(f"request {r}: kv_len {kv_len} < chain length {n}")
        pos = torch.arange(kv_len, device=q_packed.device)
        pages = kv_indices[kvp[r]:kvp[r + 1]].to(torch.int64)
        slots = pages[pos // page_size] * page_size + pos % page_size
        k = k_flat[slots].float().repeat_interleave(group, dim=1)  # [kv, H, hd]
        v = v_flat[slots].float().repeat_interleave(group, dim=1)
        q = q_packed[qo[r]:qo[r + 1]].float()  # [n, H, hd]
        scores = torch.einsum("nhd,khd->hnk", q, k) * scale
        visible = pos[None, :] < prefix + torch.arange(n, device=q.device)[:, None] + 1  # [n, kv]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[qo[r]:qo[r + 1]] = torch.einsum("hnk,khd->nhd", scores.softmax(dim=-1), v).to(q_packed.dtype)
    return out


# ---------------------------------------------------------------------------------------------- triton

if HAS_TRITON:

    @triton.jit
    def _ragged_verify_attn_kernel(
        q_ptr, sq_t, sq_h,  # [T, H, hd]
        k_ptr, v_ptr, skv_s, skv_h,  # flat caches [slots, Hkv, hd] (same strides for K and V)
        o_ptr, so_t, so_h,  # [T, H, hd]
        qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_lens_ptr,
        sm_scale,
        GROUP: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, FP32_DOT: tl.constexpr,
    ):
        r = tl.program_id(0)
        h = tl.program_id(1)
        m_blk = tl.program_id(2)
        q_start = tl.load(qo_indptr_ptr + r).to(tl.int64)
        q_len = (tl.load(qo_indptr_ptr + r + 1) - q_start).to(tl.int32)
        kv_len = tl.load(kv_lens_ptr + r).to(tl.int32)
        page_start = tl.load(kv_indptr_ptr + r).to(tl.int64)
        prefix = kv_len - q_len
        kvh = h // GROUP

        offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        dmask = offs_d < HEAD_DIM
        qmask = (offs_m < q_len)[:, None] & dmask[None, :]
        q = tl.load(q_ptr + (q_start + offs_m)[:, None] * sq_t + h * sq_h + offs_d[None, :], mask=qmask, other=0.0)
        if FP32_DOT:
            q = q.to(tl.float32)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # last kv position any row of this block may see, +1 (rows beyond q_len are masked on store)
        kv_end = tl.minimum(kv_len, prefix + (m_blk + 1) * BLOCK_M)
        for n0 in range(0, kv_end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            nmask = offs_n < kv_len
            page = tl.load(kv_indices_ptr + page_start + offs_n // PAGE_SIZE, mask=nmask, other=0).to(tl.int64)
            slot = page * PAGE_SIZE + offs_n % PAGE_SIZE
            kvmask = nmask[:, None] & dmask[None, :]
            k = tl.load(k_ptr + slot[:, None] * skv_s + kvh * skv_h + offs_d[None, :], mask=kvmask, other=0.0)
            v = tl.load(v_ptr + slot[:, None] * skv_s + kvh * skv_h + offs_d[None, :], mask=kvmask, other=0.0)
            if FP32_DOT:
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            visible = (offs_n[None, :] < prefix + offs_m[:, None] + 1) & nmask[None, :]
            s = tl.where(visible, s * sm_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if FP32_DOT:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + (q_start + offs_m)[:, None] * so_t + h * so_h + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=qmask)


def ragged_verify_attention_triton(
    q_packed: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    sm_scale: float | None = None,
    max_qo_len: int | None = None,
) -> torch.Tensor:
    """Triton fallback (CUDA, or CPU under TRITON_INTERPRET=1). Pass max_qo_len (gamma + 1) to avoid a host
    sync; without it the longest chain is read from qo_indptr."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not importable")
    T, H, hd = q_packed.shape
    k_flat, page_size = _flat_cache(k_cache)
    v_flat, _ = _flat_cache(v_cache)
    if k_flat.stride() != v_flat.stride() or k_flat.stride(2) != 1 or q_packed.stride(2) != 1:
        raise ValueError("K and V caches need identical strides and a contiguous head_dim")
    R = kv_lens.numel()
    if max_qo_len is None:
        max_qo_len = int((qo_indptr[1:] - qo_indptr[:-1]).max()) if R else 0
    out = torch.empty_like(q_packed)
    if R == 0 or max_qo_len == 0:
        return out.zero_()
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(hd)
    block_m = 16
    block_d = max(16, triton.next_power_of_2(hd))
    block_n = 16 if os.environ.get("TRITON_INTERPRET") == "1" else 64
    grid = (R, H, triton.cdiv(max_qo_len, block_m))
    _ragged_verify_attn_kernel[grid](
        q_packed, q_packed.stride(0), q_packed.stride(1),
        k_flat, v_flat, k_flat.stride(0), k_flat.stride(1),
        out, out.stride(0), out.stride(1),
        qo_indptr, kv_indptr, kv_indices, kv_lens,
        scale,
        GROUP=H // k_flat.shape[1], PAGE_SIZE=page_size, HEAD_DIM=hd,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        FP32_DOT=q_packed.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1",
        num_warps=4,
    )
    return out


# ------------------------------------------------------------------------------------------- flashinfer


def _host_int32(*tensors: torch.Tensor) -> list[np.ndarray]:
    """int32 numpy copies of small index tensors: free for CPU tensors, ONE device->host copy otherwise."""
    if all(t.device.type == "cpu" for t in tensors):
        return [t.to(torch.int32).numpy() for t in tensors]
    flat = torch.cat([t.reshape(-1).to(torch.int32) for t in tensors]).cpu().numpy()  # the one sync
    out, at = [], 0
    for t in tensors:
        out.append(flat[at:at + t.numel()])
        at += t.numel()
    return out


def _pad_layout_host(qo: np.ndarray, kvp: np.ndarray, lens: np.ndarray, num_slots: int, num_tokens: int,
                     page_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """numpy core of pad_verify_layout: (qo [S+2], kv_indptr [S+2], last_page_len [S+1], live pages, live
    tokens), S = num_slots, all int32 on the host."""
    live = lens.shape[0]
    live_tokens = int(qo[-1])
    if live > num_slots or live_tokens > num_tokens:
        raise ValueError(f"live batch ({live} requests, {live_tokens} tokens) exceeds the bucket "
                         f"({num_slots} requests, {num_tokens} tokens)")
    pad = num_slots - live
    sink_rows = num_tokens - live_tokens
    sink_pages = max(1, -(-sink_rows // page_size))
    sink_last = sink_rows - (sink_pages - 1) * page_size if sink_rows else 1
    live_pages = int(kvp[live])
    qo_p = np.empty(num_slots + 2, dtype=np.int32)
    qo_p[: live + 1] = qo
    qo_p[live + 1: num_slots + 1] = live_tokens
    qo_p[num_slots + 1] = num_tokens
    kvp_p = np.empty(num_slots + 2, dtype=np.int32)
    kvp_p[: live + 1] = kvp
    kvp_p[live + 1: num_slots + 1] = live_pages + np.arange(1, pad + 1, dtype=np.int32)
    kvp_p[num_slots + 1] = live_pages + pad + sink_pages
    last = np.empty(num_slots + 1, dtype=np.int32)
    last[:live] = lens - np.maximum(kvp[1:] - kvp[:-1] - 1, 0) * page_size
    last[live:num_slots] = 1
    last[num_slots] = sink_last
    return qo_p, kvp_p, last, live_pages, live_tokens


def pad_verify_layout(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    num_slots: int,
    num_tokens: int,
    page_size: int,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Pad a live ragged layout to a CUDA-graph bucket of num_slots requests (+1 sink) and num_tokens rows.

    Returns host int32 (qo_indptr [num_slots+2], kv_indptr [num_slots+2], last_page_len [num_slots+1]), page
    indices on `device`, and the live token count. Unused slots get qo_len 0 and one dummy page (index 0,
    length 1). The sink slot takes every query row the live batch does not use, over dummy pages as long as
    those rows (so its causal rows are well defined), because FlashInfer requires
    q.shape[0] == qo_indptr[-1] == the captured row count. The indptrs are built on the host (numpy); device
    inputs cost one device->host copy. FlashInferRaggedVerify.stage uses the numpy core directly and writes
    the dummy page entries straight into its captured page table instead of concatenating them.
    """
    qo, kvp, lens = _host_int32(qo_indptr, kv_indptr, kv_lens)
    qo_p, kvp_p, last, live_pages, live_tokens = _pad_layout_host(qo, kvp, lens, num_slots, num_tokens, page_size)
    n_dummy = int(kvp_p[-1]) - live_pages
    indices = kv_indices[:live_pages].to(device, torch.int32)
    indices = torch.cat([indices, torch.zeros(n_dummy, dtype=torch.int32, device=indices.device)])
    return torch.from_numpy(qo_p), torch.from_numpy(kvp_p), indices, torch.from_numpy(last), live_tokens


class FlashInferRaggedVerify:
    """Ragged verify attention through FlashInfer's paged prefill, one instance per token-count bucket.

    A bucket fixes (num_tokens, num_slots): the CUDA graph is captured once for it with fixed-size
    qo_indptr / kv_indptr / kv_indices / last_page_len buffers (FlashInfer's use_cuda_graph mode requires a
    fixed batch size and a row count that never grows). Per step:
        stage(qo_indptr, kv_indptr, kv_indices, kv_lens)   # host-side: pad to the bucket, plan
        out = replay(q_live)                               # copy q into the captured buffer, replay
    stage() calls wrapper.plan(), which copies the live indptrs into the captured buffers and rewrites the
    work partition in FlashInfer's int workspace. That host call is required each step: the captured kernels
    read the partition from the workspace, and a stale partition (old kv lengths) gives wrong results. What
    is paid once per bucket is allocation, planning for shape, and capture. If a step's plan ever produced a
    different launch configuration than the captured one, stage() raises instead of replaying a stale graph.

    The live layout is padded to the bucket (see pad_verify_layout); page 0 of the cache serves as the dummy
    page, so its contents must be finite. max_pages bounds the live page-table entries. Indptrs passed to
    stage() should be CPU tensors (FlashInfer reads them on the host; device tensors cost one device->host
    copy, i.e. a sync, for the three of them).

    For CUDA-graph serving prefer FlashInferStaticVerify (flashinfer_static_verify.py): planned once per
    bucket, no plan() per step. This class stays for eager use with FlashInfer's default backend.
    """

    def __init__(
        self,
        num_tokens: int,
        num_slots: int,
        max_pages: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cuda",
        sm_scale: float | None = None,
        workspace_bytes: int = 128 * 1024 * 1024,
        workspace: torch.Tensor | None = None,
    ) -> None:
        if not HAS_FLASHINFER:
            raise RuntimeError(f"flashinfer is not importable ({FLASHINFER_IMPORT_ERROR})")
        self.num_tokens, self.num_slots, self.max_pages = num_tokens, num_slots, max_pages
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.page_size, self.dtype, self.device = page_size, dtype, torch.device(device)
        self.sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
        if workspace is None:
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=self.device)
        i32 = dict(dtype=torch.int32, device=self.device)
        slots = num_slots + 1  # + the sink slot that absorbs unused query rows (see pad_verify_layout)
        sink_pages = -(-num_tokens // page_size)
        self.qo_indptr_buf = torch.zeros(slots + 1, **i32)
        self.kv_indptr_buf = torch.zeros(slots + 1, **i32)
        self.kv_indices_buf = torch.zeros(max_pages + num_slots + sink_pages, **i32)
        self.last_page_len_buf = torch.ones(slots, **i32)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True,
            qo_indptr_buf=self.qo_indptr_buf, paged_kv_indptr_buf=self.kv_indptr_buf,
            paged_kv_indices_buf=self.kv_indices_buf, paged_kv_last_page_len_buf=self.last_page_len_buf,
        )
        self.q_buf = torch.zeros(num_tokens, num_qo_heads, head_dim, dtype=dtype, device=self.device)
        self.out_buf = torch.zeros_like(self.q_buf)
        self.graph: torch.cuda.CUDAGraph | None = None
        self._captured_plan_info = None
        self.live_tokens = 0

    # -- metadata -------------------------------------------------------------------------------------------

    def stage(self, qo_indptr, kv_indptr, kv_indices, kv_lens) -> None:
        """Plan the live layout into the captured buffers (host work, outside any graph).

        Cheap by construction: the padded indptrs are built with numpy on the host (CPU inputs: no device
        traffic at all; device inputs: one device->host copy for the three of them), handed to plan() as
        pinned CPU int32 tensors (so FlashInfer's host->device copies are asynchronous, no stream sync), and
        the dummy page entries are written straight into the captured page table (one fill) rather than
        concatenated to the live indices. kv_indices may live on the device (FlashInfer copies it device to
        device, asynchronously) or on the host.
        """
        qo, kvp, lens = _host_int32(qo_indptr, kv_indptr, kv_lens)
        qo_p, kvp_p, last, live_pages, live_tokens = _pad_layout_host(
            qo, kvp, lens, self.num_slots, self.num_tokens, self.page_size)
        total_pages = int(kvp_p[-1])
        if total_pages > self.kv_indices_buf.numel():
            raise ValueError(f"{total_pages} page entries exceed the bucket's {self.kv_indices_buf.numel()}")
        n_ptr = qo_p.shape[0]
        host = torch.empty(2 * n_ptr + last.shape[0], dtype=torch.int32,
                           pin_memory=self.device.type == "cuda")  # one pinned block for the three arrays
        host_np = host.numpy()
        host_np[:n_ptr] = qo_p
        host_np[n_ptr:2 * n_ptr] = kvp_p
        host_np[2 * n_ptr:] = last
        self.kv_indices_buf[live_pages:total_pages].zero_()  # dummy pages of the padding / sink slots: page 0
        self.wrapper.plan(
            host[:n_ptr], host[n_ptr:2 * n_ptr], kv_indices[:live_pages], host[2 * n_ptr:],
            self.num_qo_heads, self.num_kv_heads, self.head_dim, self.page_size,
            causal=True, sm_scale=self.sm_scale, q_data_type=self.dtype, kv_data_type=self.dtype,
        )
        self.live_tokens = live_tokens
        plan_info = getattr(self.wrapper, "_plan_info", None)
        if self.graph is not None and plan_info is not None and self._captured_plan_info is not None:
            if list(plan_info) != self._captured_plan_info:
                raise RuntimeError("FlashInfer planned a launch configuration different from the captured one; "
                                   "re-capture this bucket (capture_graph) before replaying")

    # -- execution ------------------------------------------------------------------------------------------

    def run_eager(self, q_packed: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Run on the staged plan without a graph (q rows beyond the live count are ignored)."""
        n = q_packed.shape[0]
        self.q_buf[:n].copy_(q_packed)
        self.wrapper.run(self.q_buf, (k_cache, v_cache), out=self.out_buf)
        return self.out_buf[: self.live_tokens]

    def capture_graph(self, k_cache: torch.Tensor, v_cache: torch.Tensor, warmup: int = 2) -> None:
        """Capture run() on the current stage (call stage() first; every stage plans exactly num_tokens rows,
        so the row count FlashInfer fixes at its first plan is the bucket's)."""
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):  # JIT / autotune outside capture
                self.wrapper.run(self.q_buf, (k_cache, v_cache), out=self.out_buf)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.wrapper.run(self.q_buf, (k_cache, v_cache), out=self.out_buf)
        plan_info = getattr(self.wrapper, "_plan_info", None)
        self._captured_plan_info = list(plan_info) if plan_info is not None else None

    def replay(self, q_packed: torch.Tensor) -> torch.Tensor:
        """Copy the live queries into the captured buffer and replay; returns the live output rows (a view of
        the captured output buffer: copy it before the next replay if it must survive)."""
        if self.graph is None:
            raise RuntimeError("capture_graph() first")
        self.q_buf[: q_packed.shape[0]].copy_(q_packed)
        self.graph.replay()
        return self.out_buf[: self.live_tokens]


def ragged_verify_attention(
    q_packed: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_lens: torch.Tensor,
    sm_scale: float | None = None,
    max_qo_len: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Eager dispatcher: Triton on CUDA ("auto"), torch reference elsewhere. For CUDA graphs with FlashInfer
    use FlashInferRaggedVerify directly."""
    use_triton = backend == "triton" or (backend == "auto" and HAS_TRITON and q_packed.device.type == "cuda")
    if use_triton:
        return ragged_verify_attention_triton(q_packed, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices,
                                              kv_lens, sm_scale, max_qo_len)
    return ragged_verify_attention_reference(q_packed, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices,
                                             kv_lens, sm_scale)
