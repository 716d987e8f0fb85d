"""The target's own next-token distribution as SGLang's sampler defines it, and a cheap draw from it on a CPU.

Used by the worker's verify steps (the processed logits that rejection sampling compares drafts against) and by its
plain decode steps (sample_plain, instead of SGLang's sampler: see samples_plain_itself for why and when).
"""

from __future__ import annotations

import torch

from sglang_dspark.sampling import sample_rows
from sglang_dspark.verify.support import target_support
from sglang_dspark.verify.target_dist import process_logits


def processed_logits(logits: torch.Tensor, si, rows: torch.Tensor) -> torch.Tensor:
    """The target logits of `rows` (one per logits row) as SGLang's sampler would see them before temperature."""
    def pick(t):
        return None if t is None else t[rows]

    return process_logits(logits, additive=pick(si.acc_additive_penalties), scaling=pick(si.acc_scaling_penalties),
                          bias=pick(si.logit_bias))


def samples_plain_itself(si, reqs) -> bool:
    """Whether a plain decode step draws its tokens with sample_plain instead of SGLang's sampler.

    SGLang's CPU sampler takes a softmax plus torch.multinomial over the full vocabulary, ~6 ms per request per
    step with the embedded model (plain steps at c = 16: 216 ms at T = 0, 308 ms at T = 1). The overlap scheduler
    that `none` runs with cannot hide it either. Greedy batches keep SGLang's argmax (already cheap); grammar,
    custom logit processors, seeded (deterministic) sampling and watermarks keep SGLang's path because their
    distribution is not reproduced here."""
    if si.is_all_greedy:
        return False
    # si.grammars is filled only inside the target forward (ForwardBatch.init_new): ask the requests
    if any(getattr(r, "grammar", None) is not None for r in reqs) or getattr(si, "has_custom_logit_processor", False):
        return False
    if getattr(si, "sampling_seed", None) is not None or getattr(si, "has_watermark_candidates", False):
        return False
    return True


def sample_plain(logits: torch.Tensor, si) -> torch.Tensor:
    """One token per request from its next-token logits [bs, V], distributed as SGLang's sampler draws it
    (penalties, logit_bias, temperature, top-k / top-p / min-p; greedy rows take the argmax). Long[bs]."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    processed = processed_logits(logits, si, rows)
    support = target_support(processed, si.temperatures.view(-1), si.top_ks.view(-1), si.top_ps.view(-1),
                             si.min_ps.view(-1) if si.need_min_p_sampling else None)
    pick = sample_rows(support.probs)
    return pick if support.full_vocab else support.ids.gather(1, pick.view(-1, 1)).squeeze(1)



def custom_processor_rows(si, bs: int) -> torch.Tensor | None:
    """Bool[bs]: the requests with a custom logit processor (None when there are none)."""
    if not getattr(si, "has_custom_logit_processor", False) or not si.custom_logit_processor:
        return None
    rows = torch.zeros(bs, dtype=torch.bool)
    for entry in si.custom_logit_processor.values():
        rows[list(entry.rows)] = True
    return rows


def apply_custom_processors(processed: torch.Tensor, verify_lens: torch.Tensor, si) -> None:
    """Run SGLang's custom logit processors on each request's first verify row (its bonus row: such a request
    verifies no drafts), in place, after penalties and the grammar mask, as SGLang's sampler orders them."""
    from sglang.srt.layers.sampler import apply_custom_logit_processor

    lens = verify_lens.to(torch.int64).cpu()
    first = (torch.cumsum(lens + 1, 0) - (lens + 1)).to(processed.device)
    rows = processed[first].float().contiguous()
    apply_custom_logit_processor(rows, si)
    processed[first] = rows.to(processed.dtype)
