"""Structured outputs (JSON schema, regex, EBNF) under speculation, per request.

A request with a grammar (SGLang's `req.grammar`: xgrammar, outlines or llguidance) keeps speculating:
  walk   : before the controller runs, its matcher is walked along the draft. Row j of the request's bitmask is the
           allowed set after the committed tokens plus d_1..d_j. A position where exactly one token is allowed is
           *forced*: the draft takes that token with confidence 1 (it cannot be rejected). A greedy draft token the
           grammar forbids is replaced by the drafter's best allowed token; a sampled one ends the chain there. The
           matcher is rolled back afterwards: SGLang's scheduler advances it over the tokens this step commits.
  verify : the target logits of the request's verified rows are masked with those rows, as SGLang's sampler masks
           a plain decode step (penalties / logit_bias, then the grammar mask), so greedy argmax and rejection
           sampling both run against the grammar-constrained target distribution: the output is the one SGLang
           would produce without speculation.
Requests without a grammar are untouched. A grammar whose backend cannot roll back still gets its row-0 mask: it
verifies no drafts, but its batch-mates keep speculating.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

logger = logging.getLogger(__name__)

FORCED_CONF_LOGIT = 30.0  # sigmoid(30) = 1 - 1e-13: the controller sees a certain acceptance


def batch_grammars(reqs) -> list[tuple[int, object]]:
    """(batch row, grammar) of the requests whose next tokens a grammar constrains (SGLang's own rule: a finished
    or terminated grammar leaves its row unconstrained)."""
    out = []
    for i, req in enumerate(reqs):
        g = getattr(req, "grammar", None)
        if g is None or getattr(g, "finished", False) or g.is_terminated():
            continue
        out.append((i, g))
    return out


def allowed_ids(mask_row: torch.Tensor, vocab_size: int) -> np.ndarray:
    """Token ids a packed int32 bitmask row allows (bit t of word t // 32, little-endian)."""
    bits = np.unpackbits(mask_row.contiguous().numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def is_allowed(mask_row: torch.Tensor, token: int) -> bool:
    return bool((int(mask_row[token >> 5]) >> (token & 31)) & 1)


@dataclass
class GrammarDrafts:
    """What the walk decided for one batch step."""
    limits: torch.Tensor  # Long[R]: most drafts each request may verify (gamma where no grammar applies)
    masks: dict[int, torch.Tensor] = field(default_factory=dict)  # row -> bitmask [limit+1, W] (verify rows)
    grammars: dict[int, object] = field(default_factory=dict)  # row -> grammar (the one that applies the mask)
    forced: int = 0  # draft positions the grammar forced this step
    replaced: int = 0  # forbidden greedy drafts replaced by the drafter's best allowed token

    def __bool__(self) -> bool:
        return bool(self.masks)


def walk_drafts(reqs, drafts: torch.Tensor, conf_logits: torch.Tensor, drafted: torch.Tensor,
                greedy_drafts: torch.Tensor, vocab_size: int, draft_scores=None) -> GrammarDrafts:
    """Walk every grammar request's matcher along its draft, rewriting `drafts` / `conf_logits` (CPU, in place)
    where the grammar forces or forbids a token.

    drafts Long[R, G]; conf_logits Float[R, G]; drafted Bool[R]: the drafter proposed for this request this step
    (the others get forced tokens only); greedy_drafts Bool[R]: the request's drafts are point masses (a replaced
    token is then still a valid draft);
    draft_scores(row, position) -> (Float[n] logits, Long[n] ids or None) of the drafter at that position, used to
    pick the best allowed token in place of a forbidden one."""
    R, G = drafts.shape
    result = GrammarDrafts(limits=torch.full((R,), G, dtype=torch.int64))
    for i, grammar in batch_grammars(reqs):
        mask = grammar.allocate_vocab_mask(vocab_size=vocab_size, batch_size=G + 1, device="cpu")
        grammar.fill_vocab_mask(mask, 0)
        walked = 0
        try:
            scores = None
            if draft_scores is not None and bool(greedy_drafts[i]):
                scores = (lambda j, _i=i: draft_scores(_i, j))
            walked = _walk_one(grammar, mask, drafts[i], conf_logits[i], bool(drafted[i]), vocab_size, result,
                               scores)
        except NotImplementedError:  # a backend without rollback: no drafts for this request, mask row 0 only
            walked = 0
        result.limits[i] = walked
        result.masks[i] = mask[: walked + 1].clone()
        result.grammars[i] = grammar
    return result


def _walk_one(grammar, mask, drafts, conf_logits, drafted: bool, vocab_size: int, result: GrammarDrafts,
              scores) -> int:
    """Returns how many drafts of this request the grammar lets through; rolls the matcher back to where it was.
    scores: the drafter's logits at a position (greedy drafts only), or None."""
    G = drafts.numel()
    accepted = 0
    try:
        for j in range(G):
            row = mask[j]
            allowed = allowed_ids(row, vocab_size)
            token = int(drafts[j])
            if len(allowed) == 1:
                token = int(allowed[0])
                conf_logits[j] = FORCED_CONF_LOGIT
                result.forced += 1
            elif not drafted:
                break  # nothing drafted for this request: only forced tokens are drafts
            elif not is_allowed(row, token):
                token = _best_allowed(scores, j, allowed) if scores is not None else None
                if token is None:
                    break
                result.replaced += 1
            drafts[j] = token
            try:
                grammar.accept_token(token)
            except ValueError:  # the mask allowed it but the matcher refuses it: stop the chain before it
                break
            accepted += 1
            if grammar.is_terminated():
                break  # SGLang commits up to the terminating token and drops the rest
            grammar.fill_vocab_mask(mask, j + 1)
    finally:
        if accepted:
            grammar.rollback(accepted)
    return accepted


def _best_allowed(scores, j: int, allowed: np.ndarray) -> int | None:
    logits, ids = scores(j)
    logits = logits.float().cpu()
    allowed_t = torch.from_numpy(allowed)
    if ids is None:  # logits over the full vocabulary
        allowed_t = allowed_t[allowed_t < logits.numel()]
        if allowed_t.numel() == 0:
            return None
        return int(allowed_t[int(torch.argmax(logits[allowed_t]))])
    ids = ids.cpu()
    keep = torch.isin(ids, allowed_t)  # reduced draft vocabulary: its columns the grammar allows
    if not bool(keep.any()):
        return None
    cols = torch.nonzero(keep).view(-1)
    return int(ids[cols[int(torch.argmax(logits[cols]))]])


def mask_verify_rows(logits: torch.Tensor, verify_lens: torch.Tensor, plan: GrammarDrafts) -> None:
    """Mask, in place, the packed verify rows (request-major, 1 + verify_lens[r] rows each) of the grammar
    requests with their walked bitmasks, through the grammar backend's own apply_vocab_mask."""
    if not plan:
        return
    lens = verify_lens.to(torch.int64).cpu()
    starts = torch.cumsum(lens + 1, 0) - (lens + 1)
    for i, mask in plan.masks.items():
        n = int(lens[i]) + 1
        if n > mask.shape[0]:
            raise RuntimeError(f"DSPARK_EXT: request row {i} verifies {n - 1} drafts past its grammar walk "
                               f"({mask.shape[0] - 1})")
        s = int(starts[i])
        block = logits[s: s + n].float().contiguous()
        plan.grammars[i].apply_vocab_mask(logits=block, vocab_mask=mask[:n].to(block.device))
        logits[s: s + n] = block.to(logits.dtype)
