"""Structured outputs (JSON schema, regex, EBNF) under speculation, per request.

A request with a grammar (SGLang's `req.grammar`: xgrammar, outlines or llguidance) keeps speculating:
  walk   : before the controller runs, its matcher is walked along the draft. Row j of the request's bitmask is the
           allowed set after the committed tokens plus d_1..d_j. A position where exactly one token is allowed is
           *forced*: the draft takes that token with confidence 1 (it cannot be rejected). For a request whose drafts
           are point masses (greedy drafts, the default), the grammar's jump-forward text (what it allows next and
           nothing else, e.g. the next key of a JSON schema) and prompt/output lookup (values copied from the prompt,
           structure repeated in the output) come next, even for a request the drafter skipped: on structured
           answers they beat a drafter trained on free text. A greedy draft token the grammar forbids is replaced by
           the drafter's best allowed token; a sampled one ends the chain there. The matcher is rolled back
           afterwards: SGLang's scheduler advances it over the tokens this step commits.
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
    jump: int = 0  # draft positions taken from the grammar's jump-forward text
    lookup: int = 0  # draft positions copied from the request's prompt / output (lookup)

    def __bool__(self) -> bool:
        return bool(self.masks)

    def proposed(self, bs: int) -> torch.Tensor:
        """Bool[bs]: grammar requests with at least one draft from the walk (forced, copied or the drafter's)."""
        out = torch.zeros(bs, dtype=torch.bool)
        for i in self.masks:
            out[i] = bool(self.limits[i] > 0)
        return out


@dataclass
class CopySources:
    """Free drafts for a grammar request whose drafts are point masses: the grammar's jump-forward string (the text
    it allows next and nothing else, tokenized with the target's tokenizer) and prompt/output lookup
    (retrieval.suffix_continuation over the request's prompt and output so far)."""
    contexts: list  # per batch row: Long numpy array of prompt + output tokens, or None
    tokenizer: object | None  # HF tokenizer for jump-forward strings (None: no jump-forward)


def walk_drafts(reqs, drafts: torch.Tensor, conf_logits: torch.Tensor, drafted: torch.Tensor,
                greedy_drafts: torch.Tensor, vocab_size: int, draft_scores=None,
                sources: CopySources | None = None) -> GrammarDrafts:
    """Walk every grammar request's matcher along its draft, rewriting `drafts` / `conf_logits` (CPU, in place).

    Per position, the first that applies: the grammar allows one token (certain draft); a jump-forward or lookup
    token the grammar allows (`sources`, point-mass requests only); the drafter's token if the grammar allows it, else
    its best allowed token (greedy drafts), else the chain ends.
    drafts Long[R, G]; conf_logits Float[R, G]; drafted Bool[R]: the drafter proposed for this request this step;
    greedy_drafts Bool[R]: the request's drafts are point masses (so any token is a valid draft for it);
    draft_scores(row, position) -> (Float[n] logits, Long[n] ids or None) of the drafter at that position."""
    R, G = drafts.shape
    result = GrammarDrafts(limits=torch.full((R,), G, dtype=torch.int64))
    for i, grammar in batch_grammars(reqs):
        mask = grammar.allocate_vocab_mask(vocab_size=vocab_size, batch_size=G + 1, device="cpu")
        grammar.fill_vocab_mask(mask, 0)
        greedy = bool(greedy_drafts[i])
        scores = (lambda j, _i=i: draft_scores(_i, j)) if draft_scores is not None and greedy else None
        copy = None
        if greedy and sources is not None:
            copy = _Copy(grammar, sources.contexts[i], sources.tokenizer)
        walked = 0
        try:
            walked = _walk_one(grammar, mask, drafts[i], conf_logits[i], bool(drafted[i]), vocab_size, result,
                               scores, copy)
        except NotImplementedError:  # a backend without rollback: no drafts for this request, mask row 0 only
            walked = 0
        result.limits[i] = walked
        result.masks[i] = mask[: walked + 1].clone()
        result.grammars[i] = grammar
    return result


JUMP_CONF_LOGIT = 3.0  # jump-forward text: forced as text, but the target may tokenize it otherwise
LOOKUP_CONF_LOGIT = 1.0  # a repeated n-gram of the prompt / output continues as before
LOOKUP_MIN_NGRAM = 1  # one token is enough: a JSON value starts copying from the prompt after its first token


class _Copy:
    """Pending copy tokens for one request's walk: refilled from jump-forward, else lookup, when empty."""

    def __init__(self, grammar, context, tokenizer):
        self.grammar, self.context, self.tokenizer = grammar, context, tokenizer
        self.pending: list[int] = []
        self.source = ""

    def next(self, row: torch.Tensor, walked: list[int], room: int) -> tuple[int, str] | None:
        if not self.pending:
            self._refill(walked, room)
        if self.pending and is_allowed(row, self.pending[0]):
            return self.pending.pop(0), self.source
        self.pending = []
        return None

    def drop(self, token: int) -> None:
        """A forced token took this position: keep the pending copy only if it agreed."""
        if self.pending and self.pending[0] == token:
            self.pending.pop(0)
        else:
            self.pending = []

    def _refill(self, walked: list[int], room: int) -> None:
        if self.tokenizer is not None:
            jump = self.grammar.try_jump_forward(self.tokenizer)
            if jump:
                ids, text = jump
                ids = list(ids) or (self.tokenizer.encode(text, add_special_tokens=False) if text else [])
                if ids:
                    self.pending, self.source = [int(t) for t in ids[:room]], "jump"
                    return
        if self.context is not None:
            from sglang_dspark.retrieval import suffix_continuation

            ctx = np.concatenate([self.context, np.asarray(walked, dtype=np.int64)]) if walked else self.context
            cont, n = suffix_continuation(ctx, room, min_ngram=LOOKUP_MIN_NGRAM)
            if n:
                self.pending, self.source = cont.tolist(), "lookup"


def _walk_one(grammar, mask, drafts, conf_logits, drafted: bool, vocab_size: int, result: GrammarDrafts,
              scores, copy: _Copy | None) -> int:
    """Returns how many drafts of this request the grammar lets through; rolls the matcher back to where it was.
    scores: the drafter's logits at a position (greedy drafts only), or None; copy: copy sources, or None."""
    G = drafts.numel()
    walked: list[int] = []
    try:
        for j in range(G):
            row = mask[j]
            allowed = allowed_ids(row, vocab_size)
            if len(allowed) == 1:
                token = int(allowed[0])
                conf_logits[j] = FORCED_CONF_LOGIT
                result.forced += 1
                if copy is not None:
                    copy.drop(token)
            else:
                picked = copy.next(row, walked, G - j) if copy is not None else None
                if picked is not None:
                    token, source = picked
                    conf_logits[j] = JUMP_CONF_LOGIT if source == "jump" else LOOKUP_CONF_LOGIT
                    result.jump += source == "jump"
                    result.lookup += source == "lookup"
                elif not drafted:
                    break  # nothing drafted for this request and nothing to copy
                else:
                    token = int(drafts[j])
                    if not is_allowed(row, token):
                        token = _best_allowed(scores, j, allowed) if scores is not None else None
                        if token is None:
                            break
                        result.replaced += 1
            drafts[j] = token
            try:
                grammar.accept_token(token)
            except ValueError:  # the mask allowed it but the matcher refuses it: stop the chain before it
                break
            walked.append(token)
            if grammar.is_terminated():
                break  # SGLang commits up to the terminating token and drops the rest
            grammar.fill_vocab_mask(mask, j + 1)
    finally:
        if walked:
            grammar.rollback(len(walked))
    return len(walked)


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
