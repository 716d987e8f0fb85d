"""The one result type every acceptance rule returns."""

from dataclasses import dataclass

import torch


@dataclass
class AcceptResult:
    """Outcome of verifying R padded draft chains of width G.

    accept_lens:   Long[R]      drafts accepted (the bonus token is not counted)
    bonus_tokens:  Long[R]      token the target contributes after the accepted drafts
    output_tokens: Long[R, G+1] accepted drafts, then the bonus, then -1 padding
    num_output:    Long[R]      accept_lens + 1 (tokens committed this step, before stop-token truncation)
    """

    accept_lens: torch.Tensor
    bonus_tokens: torch.Tensor
    output_tokens: torch.Tensor
    num_output: torch.Tensor


PAD_TOKEN = -1


def assemble_result(draft_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor) -> AcceptResult:
    """Lay out [accepted drafts..., bonus, -1...] per row without a Python loop."""
    num_rows, gamma = draft_tokens.shape
    positions = torch.arange(gamma + 1, device=draft_tokens.device).unsqueeze(0)  # [1, G+1]
    padded_drafts = torch.cat(
        [draft_tokens, torch.full((num_rows, 1), PAD_TOKEN, dtype=draft_tokens.dtype, device=draft_tokens.device)], dim=1
    )
    lens = accept_lens.unsqueeze(1)
    output = torch.where(positions < lens, padded_drafts, torch.full_like(padded_drafts, PAD_TOKEN))
    output = torch.where(positions == lens, bonus_tokens.to(output.dtype).unsqueeze(1), output)
    return AcceptResult(
        accept_lens=accept_lens,
        bonus_tokens=bonus_tokens,
        output_tokens=output,
        num_output=accept_lens + 1,
    )


def leading_run_length(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row of a Bool[R, G] tensor."""
    return torch.cumprod(accepted.to(torch.int64), dim=1).sum(dim=1)


def verify_mask(verify_lens: torch.Tensor, gamma: int) -> torch.Tensor:
    """Bool[R, G]: position i of row r is verified iff i < verify_lens[r]."""
    positions = torch.arange(gamma, device=verify_lens.device).unsqueeze(0)
    return positions < verify_lens.unsqueeze(1)


def check_shapes(draft_tokens: torch.Tensor, verify_lens: torch.Tensor) -> None:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [R, G], got {tuple(draft_tokens.shape)}")
    if verify_lens.shape != draft_tokens.shape[:1]:
        raise ValueError(f"verify_lens must be [R]={draft_tokens.shape[0]}, got {tuple(verify_lens.shape)}")
