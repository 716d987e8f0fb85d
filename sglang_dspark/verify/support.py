"""Rejection sampling over packed verify rows, touching only the target's support.

The dense rule (rejection.py) needs p as [R, G+1, V] and q as [R, G, V]. With the embedded model's vocabulary
(V = 151,936) at 16 requests that is ~150 MB to build, zero and scan per step, plus a full-vocabulary sort for
top-p: ~330 ms of acceptance work at R = 16, against ~460 ms for a whole T = 0 verify step (BENCHMARKS.md, "T > 0").

Both distributions are sparse where it matters:
  * p after top-k / top-p / min-p usually lives on a few tokens, found with topk(K) + one logsumexp instead of a
    sort. The result is exact: the rows are checked to have no surviving token past rank K, and are redone with a
    full sort otherwise. When nothing is cut at all, p is the plain softmax and nothing is ranked.
  * the accept test needs q only at the draft token, and the residual max(p - q, 0) is zero outside p's support,
    so q is evaluated only at p's support of each rejecting request's stop row, in the drafter's own (possibly
    reduced) vocabulary.
Same rule, same outputs in distribution as accept_rejection; equal accept decisions given the same uniforms
(tests/unit/test_verify_support.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import sample_rows
from .rejection import RESIDUAL_MASS_EPS
from .result import AcceptResult, assemble_result, check_shapes, leading_run_length

# topk(K) for K up to this is far cheaper than a full sort; when a row needs more (top_k unset, top_p < 1 and a flat
# distribution) the batch is redone with a full sort, as the dense rule does.
FIRST_SUPPORT_K = 64
MIN_TEMPERATURE = 1e-6


@dataclass
class SupportDist:
    """Per packed row: the tokens that can be sampled and their probabilities (zero-padded, rows sum to 1)."""

    ids: torch.Tensor  # Long[N, K]
    probs: torch.Tensor  # Float[N, K]
    full_vocab: bool = False  # ids is arange(V) in every row (nothing was cut): probs[row, token] is p(token)

    def prob_of(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """p(tokens[m]) at packed row rows[m]."""
        if self.full_vocab:
            return self.probs[rows, tokens]
        return (self.probs[rows] * (self.ids[rows] == tokens.view(-1, 1))).sum(-1)


def target_support(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   min_p: torch.Tensor | None = None, first_k: int = FIRST_SUPPORT_K) -> SupportDist:
    """Processed logits [N, V] -> the sampling distribution of each row on its support (target_dist.target_probs
    semantics: softmax at temperature over all V, then top-k, top-p on the cumulative mass before top-k, min-p,
    renormalise; greedy rows (top_k == 1) keep their argmax)."""
    N, V = logits.shape
    scaled = logits.float() / temperature.view(-1, 1).float().clamp_min(MIN_TEMPERATURE)
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    top_k = top_k.view(-1).to(torch.int64).clamp(min=1)
    top_p = top_p.view(-1, 1).float()
    if N and bool((top_k >= V).all() & (top_p >= 1).all()) and (min_p is None or bool((min_p <= 0).all())):
        # nothing is cut anywhere: plain softmax, no ranking needed
        ids = torch.arange(V, device=logits.device).expand(N, V)
        return SupportDist(ids=ids, probs=torch.exp(scaled - lse), full_vocab=True)
    K = max(1, min(V, int(top_k.max()) if N else 1, first_k))
    ids, p, keep = _ranked_and_kept(scaled, lse, K, top_k, top_p, min_p)
    if K < V and not _no_survivor_past(K, p, top_k, top_p, min_p):
        ids, p, keep = _ranked_and_kept(scaled, lse, V, top_k, top_p, min_p)  # a wider topk costs nearly a sort
    probs = torch.where(keep, p, torch.zeros_like(p))
    return SupportDist(ids=ids, probs=probs / probs.sum(-1, keepdim=True))


def _ranked_and_kept(scaled, lse, K: int, top_k, top_p, min_p):
    """The K most likely tokens of each row (ids, probabilities, descending) and which of them survive the cuts."""
    V = scaled.shape[-1]
    vals, ids = scaled.sort(dim=-1, descending=True) if K == V else torch.topk(scaled, K, dim=-1, sorted=True)
    p = torch.exp(vals - lse)
    mass_before = p.cumsum(-1) - p
    rank = torch.arange(K, device=scaled.device).view(1, -1)
    keep = (rank < top_k.view(-1, 1)) & (mass_before <= top_p)
    if min_p is not None:
        keep &= p >= p[:, :1] * min_p.view(-1, 1).float()
    keep[:, 0] = True
    return ids, p, keep


def _no_survivor_past(K: int, p: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                      min_p: torch.Tensor | None) -> bool:
    """True when no token of rank >= K can survive in any row: ranks are cut by top-k, or the top-K mass already
    exceeds top-p (then rank K fails the cumulative test, and so does everything after it), or min-p already
    cuts rank K - 1 (ranks after it have no more probability)."""
    cut = (top_k <= K) | (p.sum(-1) > top_p.view(-1))
    if min_p is not None:
        cut |= p[:, -1] < p[:, 0] * min_p.view(-1).float()
    return bool(cut.all())


@dataclass
class DraftDistribution:
    """q of each request's drafts, in the drafter's own vocabulary.

    logits: Float[A, G', Vd] Markov-corrected draft logits of the A drafted requests (before temperature);
    temperature: Float[R] per request, <= 0 means a point-mass (greedy) draft;
    rows: Long[R] row of `logits` for each request, -1 for requests not drafted (they verify nothing);
    vocab: Long[Vd] sorted token ids the columns stand for, or None for the identity.
    """

    logits: torch.Tensor
    temperature: torch.Tensor
    rows: torch.Tensor
    vocab: torch.Tensor | None = None

    def log_q(self, req: torch.Tensor, pos: torch.Tensor, tokens: torch.Tensor | None,
              drafted: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
        """log q at (request req[m], draft position pos[m]) of tokens [M, K], or of every token id when tokens is
        None (then [M, vocab_size]); drafted [M] is the token drafted there (a point-mass draft has q = 1 on it)."""
        M = req.numel()
        width = vocab_size if tokens is None else tokens.shape[1]
        device = drafted.device
        neg_inf = torch.full((M, width), float("-inf"), device=device)
        if M == 0:
            return neg_inf
        temp = self.temperature[req].float()
        point = temp <= 0
        lg = self.logits[self.rows[req].clamp_min(0), pos].float() / temp.clamp_min(MIN_TEMPERATURE).view(-1, 1)
        log_probs = lg - torch.logsumexp(lg, dim=-1, keepdim=True)
        if tokens is None:
            sampled = neg_inf.clone()
            if self.vocab is None:
                sampled[:, : log_probs.shape[1]] = log_probs
            else:
                sampled[:, self.vocab] = log_probs
            onehot = neg_inf.scatter(1, drafted.view(-1, 1), 0.0)
        else:
            col, present = self._columns(tokens)
            sampled = torch.where(present, log_probs.gather(1, col), neg_inf)
            onehot = torch.where(tokens == drafted.view(-1, 1), torch.zeros_like(neg_inf), neg_inf)
        return torch.where(point.view(-1, 1), onehot, sampled)

    def _columns(self, tokens: torch.Tensor):
        if self.vocab is None:
            return tokens, torch.ones_like(tokens, dtype=torch.bool)
        col = torch.searchsorted(self.vocab, tokens.contiguous()).clamp(max=self.vocab.numel() - 1)
        return col, self.vocab[col] == tokens


def accept_rejection_packed(draft_tokens: torch.Tensor, verify_lens: torch.Tensor, target: SupportDist,
                            draft: DraftDistribution | None, generator: torch.Generator | None = None,
                            uniforms: torch.Tensor | None = None) -> AcceptResult:
    """Lossless verification of ragged chains whose target rows are packed request-major: request r owns rows
    start_r .. start_r + verify_lens[r], start_r = sum_{s<r} (verify_lens[s] + 1). draft None: every draft is a
    point mass. uniforms: optional Float[R, G] for the accept tests (else drawn from `generator`)."""
    check_shapes(draft_tokens, verify_lens)
    R, G = draft_tokens.shape
    device = draft_tokens.device
    lens = verify_lens.to(torch.int64).to(device).clamp(0, G)
    start = torch.cumsum(lens + 1, 0) - (lens + 1)
    if R and int((lens + 1).sum()) != target.ids.shape[0]:
        raise ValueError(f"target has {target.ids.shape[0]} rows, verify_lens need {int((lens + 1).sum())}")
    if uniforms is None:
        uniforms = torch.rand((R, G), generator=generator, device=device)

    # accept tests, on the verified (request, position) pairs only
    req, pos = torch.nonzero(torch.arange(G, device=device).view(1, -1) < lens.view(-1, 1), as_tuple=True)
    accepted = torch.zeros(R, G, dtype=torch.bool, device=device)
    if req.numel():
        rows = start[req] + pos
        d = draft_tokens[req, pos]
        p_d = target.prob_of(rows, d)
        q_d = torch.ones_like(p_d) if draft is None else draft.log_q(req, pos, d.view(-1, 1), d).squeeze(1).exp()
        accepted[req, pos] = uniforms[req, pos].float() * q_d < p_d
    accept_lens = leading_run_length(accepted)

    # bonus: from the stop row; a rejecting request samples the residual max(p - q, 0) on p's support
    stop = start + accept_lens
    p = target.probs[stop]
    weights = p
    rejected = torch.nonzero(accept_lens < lens, as_tuple=True)[0]
    if rejected.numel():
        col = accept_lens[rejected]
        d = draft_tokens[rejected, col]
        support = None if target.full_vocab else target.ids[stop[rejected]]
        if draft is None:
            q = torch.zeros_like(p[rejected]).scatter_(1, d.view(-1, 1), 1.0) if support is None else \
                (support == d.view(-1, 1)).float()
        else:
            q = draft.log_q(rejected, col, support, d, vocab_size=p.shape[1]).exp()
        residual = (p[rejected] - q).clamp_min(0.0)
        usable = residual.sum(-1, keepdim=True) > RESIDUAL_MASS_EPS  # else p == q: see rejection.py
        weights = p.clone()
        weights[rejected] = torch.where(usable, residual, p[rejected])
    pick = sample_rows(weights, generator)
    bonus = pick if target.full_vocab else target.ids[stop].gather(1, pick.view(-1, 1)).squeeze(1)
    return assemble_result(draft_tokens, accept_lens, bonus)
