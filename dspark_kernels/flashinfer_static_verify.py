"""Ragged verify attention on FlashInfer, planned ONCE per bucket: no plan() per step, CUDA-graph replay.

Why a second FlashInfer path. FlashInferRaggedVerify (flashinfer_verify.py) calls plan() every step: its work
partition depends on the live lengths, and plan() costs ~2 ms of host time (H200 run, BENCHMARKS "Kernels on a
GPU"). This class makes the partition independent of them, so one plan serves every step of a bucket:

- FA2 backend, split-KV off. With split-KV off FlashInfer gives each (request, query tile) one work item that
  walks the whole KV of that request; the KV length is read at run time from kv_indptr / last_page_len, and the
  query length and query offset from qo_indptr. In CUDA-graph mode the query tile size is fixed by the bucket's
  row count, not by the live lengths (FlashInfer's PrefillSplitQOKVIndptr, v0.6).
- Planned with every slot at the full chain width W (gamma + 1). Work items then exist for W rows per slot, and a
  live chain of n <= W rows is covered; rows past n are masked by the kernel's own live qo_len.
- The one thing that stays planned is where a request's output goes: FlashInfer writes request r's rows from
  its planned output offset, r * W, not from the live qo_indptr. So the output buffer is slot-strided
  [S * W, H, hd], and a gather inside the graph packs the live rows back: packed row t of slot s, position i,
  reads strided row s * W + i.

Per step stage() is numpy on the host plus one pinned host->device copy (indptrs, last-page lengths, gather
rows) and the live page indices: no plan, no FlashInfer Python. replay() copies q and replays the graph, which
holds the attention launch and the gather. FA3 (FlashInfer's default on Hopper) sorts work by KV length at plan
time, so it cannot be planned once; this class always asks for FA2.

Unused slots get qo_len 0 and one dummy page (cache page 0, which must hold finite values). The cache layout
and masks are those of flashinfer_verify.py's module docstring.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dspark_kernels.flashinfer_verify import FLASHINFER_IMPORT_ERROR, HAS_FLASHINFER, _host_int32

if HAS_FLASHINFER:
    import flashinfer


def static_verify_layout(qo: np.ndarray, kvp: np.ndarray, lens: np.ndarray, num_slots: int, width: int,
                         page_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Live ragged layout -> the buffers of a bucket planned at (num_slots, width), all int32 numpy.

    Returns (qo_indptr [S+1], kv_indptr [S+1], last_page_len [S], gather_rows [S*W], live pages, live tokens).
    Live requests keep their packed query rows and their pages; unused slots get no rows and one dummy page.
    gather_rows[t] is the slot-strided output row of packed row t (0 past the live rows).
    """
    live = lens.shape[0]
    live_tokens = int(qo[-1])
    n = qo[1:] - qo[:-1]
    if live > num_slots:
        raise ValueError(f"{live} requests exceed the bucket's {num_slots} slots")
    if live and int(n.max()) > width:
        raise ValueError(f"a chain of {int(n.max())} tokens exceeds the bucket's width {width}")
    if np.any(lens < n):
        raise ValueError("every request's kv length must cover its chain")
    live_pages = int(kvp[live])
    pad = num_slots - live
    qo_b = np.empty(num_slots + 1, dtype=np.int32)
    qo_b[: live + 1] = qo
    qo_b[live + 1:] = live_tokens
    kvp_b = np.empty(num_slots + 1, dtype=np.int32)
    kvp_b[: live + 1] = kvp
    kvp_b[live + 1:] = live_pages + np.arange(1, pad + 1, dtype=np.int32)
    last = np.ones(num_slots, dtype=np.int32)
    last[:live] = lens - np.maximum(kvp[1:] - kvp[:-1] - 1, 0) * page_size
    gather = np.zeros(num_slots * width, dtype=np.int32)
    slot_of_row = np.repeat(np.arange(live, dtype=np.int32), n)
    gather[:live_tokens] = slot_of_row * width + (np.arange(live_tokens, dtype=np.int32) - qo[slot_of_row])
    return qo_b, kvp_b, last, gather, live_pages, live_tokens


class FlashInferStaticVerify:
    """One bucket of (num_slots chains of at most `width` tokens); see the module docstring.

        fsv = FlashInferStaticVerify(num_slots, width, max_pages, Hq, Hkv, hd, page_size)   # plans once
        fsv.stage(qo_indptr, kv_indptr, kv_indices, kv_lens)   # host numpy + one copy, every step
        fsv.capture_graph(k_cache, v_cache)                    # once
        out = fsv.replay(q_packed)                             # every step: [live tokens, Hq, hd]

    max_pages bounds the live page-table entries. Indptrs and kv_lens should be CPU tensors (device ones cost
    one device->host copy for the three of them); kv_indices may be on either side.
    """

    def __init__(
        self,
        num_slots: int,
        width: int,
        max_pages: int,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        dtype: torch.dtype = torch.bfloat16,
        device: str | torch.device = "cuda",
        sm_scale: float | None = None,
        workspace_bytes: int = 128 * 1024 * 1024,
    ) -> None:
        if not HAS_FLASHINFER:
            raise RuntimeError(f"flashinfer is not importable ({FLASHINFER_IMPORT_ERROR})")
        self.num_slots, self.width, self.page_size = num_slots, width, page_size
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
        rows = num_slots * width
        n_ptr = num_slots + 1
        # every per-step array in one device block (views), so a step's metadata is one host->device copy
        self._meta = torch.zeros(2 * n_ptr + num_slots + rows, dtype=torch.int32, device=self.device)
        self.qo_indptr_buf = self._meta[:n_ptr]
        self.kv_indptr_buf = self._meta[n_ptr:2 * n_ptr]
        self.last_page_len_buf = self._meta[2 * n_ptr:2 * n_ptr + num_slots]
        self.gather_buf = self._meta[2 * n_ptr + num_slots:]
        self.kv_indices_buf = torch.zeros(max_pages + num_slots, dtype=torch.int32, device=self.device)
        self.q_buf = torch.zeros(rows, num_qo_heads, head_dim, dtype=dtype, device=self.device)
        self.strided_out = torch.zeros_like(self.q_buf)
        self.packed_out = torch.zeros_like(self.q_buf)
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=self.device)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, backend="fa2",
            qo_indptr_buf=self.qo_indptr_buf, paged_kv_indptr_buf=self.kv_indptr_buf,
            paged_kv_indices_buf=self.kv_indices_buf, paged_kv_last_page_len_buf=self.last_page_len_buf,
        )
        self._plan_full_width()
        # two pinned staging blocks, alternated: the host writes one while the other's copy may be in flight
        pinned = self.device.type == "cuda"
        self._host = [torch.zeros(self._meta.numel(), dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        self._host_copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.live_tokens = 0
        self.plans = 1  # never grows: benchmarks/kernels.py reports it

    def _plan_full_width(self) -> None:
        """The one plan: every slot a chain of `width` rows over `width` kv positions (the lengths only fix
        the work items; the KV length itself is read at run time)."""
        S, W, ps = self.num_slots, self.width, self.page_size
        pages = -(-W // ps)
        qo = torch.arange(S + 1, dtype=torch.int32) * W
        kvp = torch.arange(S + 1, dtype=torch.int32) * pages
        last = torch.full((S,), W - (pages - 1) * ps, dtype=torch.int32)
        indices = torch.zeros(S * pages, dtype=torch.int32)
        if indices.numel() > self.kv_indices_buf.numel():
            raise ValueError(f"max_pages too small for the planning layout ({indices.numel()} entries)")
        # In CUDA-graph mode FlashInfer launches more work items than the plan fills; the rest read the int
        # workspace's leftover bytes as (request, tile) ids. Zeroed, they repeat request 0's first tile, which
        # writes the same values again; left as they are, they could name any request.
        pinned_ws = getattr(self.wrapper, "_pin_memory_int_workspace_buffer", None)
        if pinned_ws is not None:
            pinned_ws.zero_()
        self.wrapper.plan(qo, kvp, indices, last, self.num_qo_heads, self.num_kv_heads, self.head_dim, ps,
                          causal=True, sm_scale=self.sm_scale, q_data_type=self.dtype, kv_data_type=self.dtype,
                          disable_split_kv=True)

    def stage(self, qo_indptr, kv_indptr, kv_indices, kv_lens) -> None:
        """Write the live layout into the captured buffers (no plan)."""
        qo, kvp, lens = _host_int32(qo_indptr, kv_indptr, kv_lens)
        qo_b, kvp_b, last, gather, live_pages, live_tokens = static_verify_layout(
            qo, kvp, lens, self.num_slots, self.width, self.page_size)
        total_pages = int(kvp_b[-1])
        if total_pages > self.kv_indices_buf.numel():
            raise ValueError(f"{total_pages} page entries exceed the bucket's {self.kv_indices_buf.numel()}")
        turn = self._turn
        self._turn ^= 1
        if self._host_copied[turn] is not None:
            self._host_copied[turn].synchronize()  # its copy two steps ago has long finished in a serving loop
        host = self._host[turn].numpy()
        n_ptr = self.num_slots + 1
        host[:n_ptr] = qo_b
        host[n_ptr:2 * n_ptr] = kvp_b
        host[2 * n_ptr:2 * n_ptr + self.num_slots] = last
        host[2 * n_ptr + self.num_slots:] = gather
        self._meta.copy_(self._host[turn], non_blocking=True)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._host_copied[turn] = event
        self.kv_indices_buf[:live_pages].copy_(kv_indices[:live_pages], non_blocking=True)
        self.kv_indices_buf[live_pages:total_pages].zero_()
        self.live_tokens = live_tokens

    def _attend(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.wrapper.run(self.q_buf, (k_cache, v_cache), out=self.strided_out)
        torch.index_select(self.strided_out, 0, self.gather_buf, out=self.packed_out)

    def run_eager(self, q_packed: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """The same work without a graph, on the staged layout."""
        self.q_buf[: q_packed.shape[0]].copy_(q_packed)
        self._attend(k_cache, v_cache)
        return self.packed_out[: self.live_tokens]

    def capture_graph(self, k_cache: torch.Tensor, v_cache: torch.Tensor, warmup: int = 2) -> None:
        """Capture attention + gather once; any staged layout replays it (the plan never changes)."""
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self._attend(k_cache, v_cache)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._attend(k_cache, v_cache)

    def replay(self, q_packed: torch.Tensor) -> torch.Tensor:
        """Live output rows, a view of the captured buffer (copy it if it must outlive the next replay)."""
        if self.graph is None:
            raise RuntimeError("capture_graph() first")
        self.q_buf[: q_packed.shape[0]].copy_(q_packed)
        self.graph.replay()
        return self.packed_out[: self.live_tokens]
