"""Greedy (T=0) verification: accept the leading drafts that equal the target's argmax."""

import torch

from .result import AcceptResult, assemble_result, check_shapes, leading_run_length, verify_mask


def accept_greedy(draft_tokens: torch.Tensor, verify_lens: torch.Tensor, target_tokens: torch.Tensor) -> AcceptResult:
    """Prefix-match verification for R ragged chains stored dense.

    draft_tokens:  Long[R, G]   drafts d_1..d_G (only the first verify_lens[r] are real for row r)
    verify_lens:   Long[R]      in [0, G]
    target_tokens: Long[R, G+1] target_tokens[r, i] = target's greedy token after anchor + d_1..d_i
    """
    check_shapes(draft_tokens, verify_lens)
    num_rows, gamma = draft_tokens.shape
    if target_tokens.shape != (num_rows, gamma + 1):
        raise ValueError(f"target_tokens must be [R, G+1]=({num_rows}, {gamma + 1}), got {tuple(target_tokens.shape)}")
    verify_lens = verify_lens.to(torch.int64).clamp(0, gamma)
    matches = (draft_tokens == target_tokens[:, :gamma]) & verify_mask(verify_lens, gamma)
    accept_lens = leading_run_length(matches)
    bonus = target_tokens.gather(1, accept_lens.unsqueeze(1)).squeeze(1)
    return assemble_result(draft_tokens, accept_lens, bonus)
