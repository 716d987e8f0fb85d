"""Turn a decode ScheduleBatch into ONE ragged EXTEND forward over [anchor, d_1..d_l] chains.

EXTEND is the mode every attention backend already runs ragged with a prefix (causal inside each chain, full
attention to the committed KV), so ragged verify needs no backend patch. The scheduler snapshots and restores every
batch field around the worker call (`_forward_isolation`), so we rewrite the batch in place.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode


def rewrite_as_verify_extend(batch, req_to_token: torch.Tensor, anchors: torch.Tensor, drafts: torch.Tensor,
                             verify_lens: torch.Tensor, committed_lens: torch.Tensor):
    """Returns (slots [T], positions [T], rows [T]) of the T = sum(1 + verify_lens) verify tokens."""
    device = anchors.device
    bs, gamma = drafts.shape
    ext = (verify_lens + 1).to(torch.int64)
    chain = torch.cat([anchors.view(-1, 1), drafts], dim=1)  # [bs, 1+gamma]
    col = torch.arange(gamma + 1, device=device).view(1, -1)
    take = col < ext.view(-1, 1).to(device)
    input_ids = chain[take]
    rows = torch.arange(bs, device=device).view(-1, 1).expand(bs, gamma + 1)[take]
    offsets = col.expand(bs, gamma + 1)[take]
    committed = committed_lens.to(device)
    positions = committed[rows] + offsets
    pool_idx = batch.req_pool_indices.to(req_to_token.device)
    slots = req_to_token[pool_idx[rows.to(req_to_token.device)], positions.to(req_to_token.device)].to(torch.int64)

    ext_list = ext.tolist()
    committed_list = committed_lens.tolist()
    new_lens = [c + e for c, e in zip(committed_list, ext_list)]
    batch.forward_mode = ForwardMode.EXTEND
    batch.input_ids = input_ids.to(torch.int64)
    batch.out_cache_loc = slots
    batch.prefix_lens = list(committed_list)
    batch.extend_lens = list(ext_list)
    batch.extend_num_tokens = sum(ext_list)
    batch.extend_logprob_start_lens = list(ext_list)
    batch.seq_lens = torch.tensor(new_lens, dtype=torch.int64, device=batch.seq_lens.device)
    batch.seq_lens_cpu = torch.tensor(new_lens, dtype=torch.int64)
    batch.seq_lens_sum = sum(new_lens)
    batch.return_logprob = False
    batch.spec_info = None
    return slots, positions, rows


def rewrite_as_plain_decode(batch, req_to_token: torch.Tensor, anchors: torch.Tensor, committed_lens: torch.Tensor):
    """The whole batch verifies nothing this step: one ordinary DECODE forward over the anchors.

    Same KV slot as a 1-token chain (position = committed length), but SGLang's own decode path: its attention
    kernel, its last-row logits and its sampler, so a skipped step costs what a step without speculation costs and
    is numerically the step no-speculation would take. Returns (slots [bs], positions [bs])."""
    device = anchors.device
    committed = committed_lens.to(torch.int64)
    pool_idx = batch.req_pool_indices.to(req_to_token.device)
    slots = req_to_token[pool_idx, committed.to(req_to_token.device)].to(torch.int64)
    new_lens = (committed + 1).tolist()
    batch.forward_mode = ForwardMode.DECODE
    batch.input_ids = anchors.to(torch.int64)
    batch.out_cache_loc = slots
    batch.seq_lens = torch.tensor(new_lens, dtype=torch.int64, device=batch.seq_lens.device)
    batch.seq_lens_cpu = torch.tensor(new_lens, dtype=torch.int64)
    batch.seq_lens_sum = sum(new_lens)
    batch.return_logprob = False
    batch.spec_info = None
    return slots, committed.to(device)


@contextmanager
def skip_sampled_logits(logits_processor, width: int):
    """Inside a verify forward SGLang's LogitsProcessor still multiplies each request's LAST row by the lm_head for
    sampling, which a verify forward never does; the worker computes the logits of every verified row itself from
    last_hidden_states. Skipping that R x V x d matmul saves ~2 GFLOP per step at batch 16 on the embedded model."""
    logits_processor._get_logits = lambda hidden_states, *args, **kwargs: hidden_states.new_empty(
        (hidden_states.shape[0], width))
    try:
        yield
    finally:
        del logits_processor._get_logits  # the class method again
