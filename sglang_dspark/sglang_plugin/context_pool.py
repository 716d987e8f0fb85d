"""The drafter's injected context K/V, stored per target KV slot.

Indexed by the target's slot ids (`out_cache_loc` / `req_to_token`), so everything SGLang does with slots carries
over for free: a radix-cache hit reuses the prefix's drafter context, retraction and release need no bookkeeping,
and rejected verify positions (beyond the committed length) are simply overwritten next step.

Writes are deferred (`defer`) and applied in one batch (`flush`) right before the pool is read. Under load the
controller drafts rarely (draft skipping), and one projection of many steps' tokens costs about what one step's
costs on a CPU: a per-step write was ~1.2% of a plain decode step at 4 requests (docs/benchmark-log.md, 2026-11-30, "Plain-step overhead").
"""

from __future__ import annotations

import torch

from sglang_dspark.drafter.model import DSparkDraftModel

MAX_PENDING_TOKENS = 4096  # bounds the features held back (m*d values each) before a flush is forced


class DraftContextPool:
    def __init__(self, drafter: DSparkDraftModel, num_slots: int, device: torch.device, dtype: torch.dtype):
        c = drafter.config
        shape = (c.num_hidden_layers, num_slots, c.num_key_value_heads, c.head_dim)
        self.drafter = drafter
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._pending_tokens = 0

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def pending_tokens(self) -> int:
        return self._pending_tokens

    @torch.no_grad()
    def write(self, slots: torch.Tensor, positions: torch.Tensor, target_features: torch.Tensor) -> None:
        """Project target features [N, m*d] at absolute positions [N] and store their K/V at slots [N] now (after
        any deferred writes, which are older)."""
        self.flush()
        self._store(slots, positions, target_features)

    def defer(self, slots: torch.Tensor, positions: torch.Tensor, target_features: torch.Tensor) -> None:
        """`write`, applied at the next flush / write / gather. Later writes to a slot win over earlier ones."""
        if slots.numel() == 0:
            return
        # a copy: under CUDA graphs the captured features live in a buffer the next replay overwrites
        self._pending.append((slots, positions, target_features.clone()))
        self._pending_tokens += slots.numel()
        if self._pending_tokens >= MAX_PENDING_TOKENS:
            self.flush()

    @torch.no_grad()
    def flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending, self._pending_tokens = self._pending, [], 0
        slots = torch.cat([s for s, _, _ in pending])
        positions = torch.cat([p.to(slots.device) for _, p, _ in pending])
        feats = torch.cat([f for _, _, f in pending])
        keep = _last_occurrence(slots)
        self._store(slots[keep], positions[keep], feats[keep.to(feats.device)])

    def _store(self, slots: torch.Tensor, positions: torch.Tensor, target_features: torch.Tensor) -> None:
        if slots.numel() == 0:
            return
        ctx = self.drafter.project_context(target_features)
        k, v = self.drafter.context_kv(ctx, positions.to(ctx.device))
        self.k[:, slots] = k.to(self.k.dtype)
        self.v[:, slots] = v.to(self.v.dtype)

    def gather(self, req_to_token: torch.Tensor, pool_indices: torch.Tensor, lens: torch.Tensor):
        """Context of each request = its first lens[r] slots -> k, v [L, R, C, Hkv, hd] and valid [R, C]."""
        self.flush()
        C = max(int(lens.max()), 1)
        slots = req_to_token[pool_indices, :C].long()  # [R, C]
        valid = torch.arange(C, device=lens.device)[None, :] < lens[:, None]
        slots = torch.where(valid.to(slots.device), slots, torch.zeros_like(slots))
        return self.k[:, slots], self.v[:, slots], valid.to(self.k.device)


def _last_occurrence(slots: torch.Tensor) -> torch.Tensor:
    """Bool mask of the entries that are the last write to their slot (an index_put with duplicate indices keeps
    an unspecified one)."""
    n = slots.numel()
    order = torch.argsort(slots, stable=True)  # equal slots stay in write order
    s = slots[order]
    last_in_run = torch.ones(n, dtype=torch.bool, device=slots.device)
    last_in_run[:-1] = s[1:] != s[:-1]
    keep = torch.zeros(n, dtype=torch.bool, device=slots.device)
    keep[order[last_in_run]] = True
    return keep
