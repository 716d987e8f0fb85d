"""The drafter's injected context K/V, stored per target KV slot.

Indexed by the target's slot ids (`out_cache_loc` / `req_to_token`), so everything SGLang does with slots carries
over for free: a radix-cache hit reuses the prefix's drafter context, retraction and release need no bookkeeping,
and rejected verify positions (beyond the committed length) are simply overwritten next step.
"""

from __future__ import annotations

import torch

from sglang_dspark.drafter.model import DSparkDraftModel


class DraftContextPool:
    def __init__(self, drafter: DSparkDraftModel, num_slots: int, device: torch.device, dtype: torch.dtype):
        c = drafter.config
        shape = (c.num_hidden_layers, num_slots, c.num_key_value_heads, c.head_dim)
        self.drafter = drafter
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    @torch.no_grad()
    def write(self, slots: torch.Tensor, positions: torch.Tensor, target_features: torch.Tensor) -> None:
        """Project target features [N, m*d] at absolute positions [N] and store their K/V at slots [N]."""
        if slots.numel() == 0:
            return
        ctx = self.drafter.project_context(target_features)
        k, v = self.drafter.context_kv(ctx, positions.to(ctx.device))
        self.k[:, slots] = k.to(self.k.dtype)
        self.v[:, slots] = v.to(self.v.dtype)

    def gather(self, req_to_token: torch.Tensor, pool_indices: torch.Tensor, lens: torch.Tensor):
        """Context of each request = its first lens[r] slots -> k, v [L, R, C, Hkv, hd] and valid [R, C]."""
        C = max(int(lens.max()), 1)
        slots = req_to_token[pool_indices, :C].long()  # [R, C]
        valid = torch.arange(C, device=lens.device)[None, :] < lens[:, None]
        slots = torch.where(valid.to(slots.device), slots, torch.zeros_like(slots))
        return self.k[:, slots], self.v[:, slots], valid.to(self.k.device)
