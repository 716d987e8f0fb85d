"""Speculative (rejection) sampling for R ragged chains: the output is distributed exactly as the target's.

For each verified position i (0-based, i < verify_lens[r]) draft d_i was sampled from q_i and the target's
distribution there is p_i. Accept d_i iff u_i < min(1, p_i(d_i) / q_i(d_i)); stop at the first rejection.
  * rejection at position a: bonus ~ normalize(max(p_a - q_a, 0)), the residual. Its mass equals the
    probability of rejecting at a (1 - sum_x min(p_a, q_a)), so when the mass is <= 1e-8 this branch is reached
    with probability <= 1e-8 and p_a == q_a up to rounding; the residual is then numerically meaningless and we
    sample from p_a instead (any choice keeps the error below 1e-8; p_a is the natural one).
  * every verified draft accepted (including verify_lens[r] == 0): bonus ~ p at position verify_lens[r].
A draft that is a point mass (greedy drafter at T>0) is the special case q_i = one_hot(d_i): accept with
probability p_i(d_i), residual = p_a with d_a removed. Pass draft_probs=None for that case to avoid building
the [R, G, V] one-hot tensor.
"""

import torch

from .result import AcceptResult, assemble_result, check_shapes, leading_run_length, verify_mask

RESIDUAL_MASS_EPS = 1e-8


def accept_rejection(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    verify_lens: torch.Tensor,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> AcceptResult:
    """Lossless verification of dense-padded draft chains.

    draft_tokens: Long[R, G]; draft_probs: Float[R, G, V] (q, rows sum to 1) or None for point-mass drafts;
    target_probs: Float[R, G+1, V] (p after anchor + d_1..d_i); verify_lens: Long[R] in [0, G];
    uniforms: optional Float[R, G] in [0, 1) for the accept tests (tests / reproducibility); otherwise drawn
    from `generator` (which must live on the tensors' device). Residual/bonus sampling always uses `generator`.
    """
    check_shapes(draft_tokens, verify_lens)
    num_rows, gamma = draft_tokens.shape
    device = draft_tokens.device
    if target_probs.shape[:2] != (num_rows, gamma + 1):
        raise ValueError(f"target_probs must be [R, G+1, V], got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != (num_rows, gamma, target_probs.shape[2]):
        raise ValueError(f"draft_probs must be [R, G, V] matching target_probs, got {tuple(draft_probs.shape)}")
    verify_lens = verify_lens.to(torch.int64).clamp(0, gamma)

    # --- accept tests: u * q(d) < p(d) is u < p/q without dividing (q(d)=0 with p(d)>0 accepts, p(d)=0 rejects).
    token_index = draft_tokens.unsqueeze(2)
    p_of_draft = target_probs[:, :gamma].gather(2, token_index).squeeze(2).float()
    if draft_probs is None:
        q_of_draft = torch.ones_like(p_of_draft)
    else:
        q_of_draft = draft_probs.gather(2, token_index).squeeze(2).float()
    if uniforms is None:
        uniforms = torch.rand((num_rows, gamma), generator=generator, device=device)
    accepted = (uniforms.float() * q_of_draft < p_of_draft) & verify_mask(verify_lens, gamma)
    accept_lens = leading_run_length(accepted)

    # --- bonus: only the row's stop position matters, so gather R rows of V instead of touching [R, G, V].
    rows = torch.arange(num_rows, device=device)
    p_stop = target_probs[rows, accept_lens].float()  # [R, V]
    rejected = accept_lens < verify_lens  # else every verified draft was accepted: bonus ~ p
    stop_col = accept_lens.clamp(max=max(gamma - 1, 0))
    if gamma == 0:
        residual = p_stop
    elif draft_probs is None:
        residual = p_stop.scatter(1, draft_tokens[rows, stop_col].unsqueeze(1), 0.0)
    else:
        residual = (p_stop - draft_probs[rows, stop_col].float()).clamp_min(0.0)
    residual_mass = residual.sum(dim=1, keepdim=True)
    use_residual = rejected.unsqueeze(1) & (residual_mass > RESIDUAL_MASS_EPS)
    sample_from = torch.where(use_residual, residual, p_stop)  # multinomial normalises rows itself
    bonus = torch.multinomial(sample_from, 1, generator=generator).squeeze(1)
    return assemble_result(draft_tokens, accept_lens, bonus)
