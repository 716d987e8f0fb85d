"""Batch-1 speculative decoding with an HF target and a DSpark drafter (reference §3), scheduler off:
every round verifies the full block (gamma = block size).

T = 0: a draft is accepted iff it equals the target argmax; the bonus is the target argmax (exactly greedy).
T > 0: rejection sampling, accept d_i with prob min(1, p_i(d_i) / q_i(d_i)); on the first rejection the bonus is
drawn from normalize(max(p - q, 0)) (p itself if that mass vanishes); if all are accepted, from p_B.
The drafter keeps a context K/V cache exactly like the serving worker: after each round only the features of
[anchor, accepted drafts] are projected and appended.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..drafter.model import GREEDY_TEMPERATURE
from ..train.target import HFTarget, crop_cache


@dataclass
class Round:
    proposed: int  # drafts verified (n)
    accepted: int  # leading accepted drafts (a), after truncation at a stop token
    tau: int  # tokens committed this round (a + 1 with the bonus; a when a stop token ended it)
    conf_logits: torch.Tensor  # [n] raw confidence logits of the verified drafts


@dataclass
class Generation:
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)


def _sample(logits: torch.Tensor, temperature: float, generator) -> int:
    if temperature < GREEDY_TEMPERATURE:
        return int(logits.argmax(-1))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _new_cache(target: HFTarget):
    from transformers import DynamicCache

    return DynamicCache(config=target.model.config)


def verify_block(drafts: torch.Tensor, q_logits: torch.Tensor, p_logits: torch.Tensor, temperature: float,
                 generator, draft_temperature: float | None = None) -> tuple[int, int]:
    """drafts [n], q_logits [n, V] (draft), p_logits [n+1, V] (target) -> (accepted a, bonus token).
    draft_temperature: what the drafts were sampled at (default: the target's temperature; 0: greedy drafts,
    a point-mass q)."""
    n = drafts.shape[0]
    if temperature < GREEDY_TEMPERATURE:
        ok = drafts == p_logits[:n].argmax(-1)
        a = int(ok.long().cumprod(0).sum())
        return a, int(p_logits[a].argmax(-1))
    p = torch.softmax(p_logits.float() / temperature, dim=-1)
    draft_t = temperature if draft_temperature is None else draft_temperature
    if draft_t < GREEDY_TEMPERATURE:
        q = torch.zeros_like(p[:n]).scatter_(1, drafts.view(-1, 1), 1.0)
    else:
        q = torch.softmax(q_logits.float() / draft_t, dim=-1)
    rows = torch.arange(n, device=drafts.device)
    ratio = p[rows, drafts] / q[rows, drafts].clamp_min(1e-8)
    u = torch.rand(n, generator=generator, device=generator.device if generator is not None else None)
    a = int((u.to(ratio.device) < ratio.clamp(max=1.0)).long().cumprod(0).sum())
    if a < n:
        resid = (p[a] - q[a]).clamp_min(0)
        dist = resid / resid.sum() if float(resid.sum()) > 1e-8 else p[a]
    else:
        dist = p[n]
    return a, int(torch.multinomial(dist, 1, generator=generator))


@torch.no_grad()
def speculative_generate(target: HFTarget, drafter, prompt_ids: list[int], max_new_tokens: int,
                         temperature: float = 0.0, generator: torch.Generator | None = None,
                         stop_ids: list[int] | tuple = (), draft_temperature: float | None = None) -> Generation:
    dev = target.device
    stop = set(stop_ids)
    P = len(prompt_ids)
    cache = _new_cache(target)
    last, feats = target.forward(torch.tensor([prompt_ids], device=dev), torch.arange(P, device=dev)[None], cache)
    out = Generation(tokens=[_sample(target.logits(last[0, -1]), temperature, generator)])  # not a round
    if out.tokens[0] in stop:
        return out
    ck, cv = drafter.context_kv(drafter.project_context(feats[0]), torch.arange(P, device=dev))
    ck, cv = ck[:, None], cv[:, None]
    start = P  # absolute position of the anchor (last committed token, not yet seen by the target)
    temp = torch.tensor([float(temperature if draft_temperature is None else draft_temperature)], device=dev)
    while len(out.tokens) < max_new_tokens:
        anchor = out.tokens[-1]
        prop = drafter.propose(torch.tensor([anchor], device=dev), torch.tensor([start], device=dev), ck, cv,
                               torch.ones(1, ck.shape[2], dtype=torch.bool, device=dev), temp, generator)
        drafts = prop.tokens[0]
        n = drafts.shape[0]
        verify_ids = torch.cat([torch.tensor([anchor], device=dev), drafts])[None]
        last, feats = target.forward(verify_ids, torch.arange(start, start + n + 1, device=dev)[None], cache)
        vocab = getattr(prop, "vocab", None)  # reduced draft vocabulary: q is zero outside it
        q_logits = prop.logits[0] if vocab is None else prop.dense_logits(drafter.config.vocab_size)[0]
        a, bonus = verify_block(drafts, q_logits, target.logits(last[0]), temperature, generator, draft_temperature)
        accepted = drafts[:a].tolist()
        hit = [i for i, t in enumerate(accepted) if t in stop]
        if hit:  # a stop token among the accepted drafts ends the generation; no bonus
            accepted = accepted[: hit[0] + 1]
            out.tokens += accepted
            out.rounds.append(Round(n, len(accepted), len(accepted), prop.conf_logits[0, : len(accepted)].cpu()))
            break
        out.tokens += accepted + [bonus]
        out.rounds.append(Round(n, a, a + 1, prop.conf_logits[0].cpu()))
        crop_cache(cache, start + a + 1)  # keep anchor + accepted drafts; the bonus is the next anchor
        nk, nv = drafter.context_kv(drafter.project_context(feats[0, : a + 1]),
                                    torch.arange(start, start + a + 1, device=dev))
        ck, cv = torch.cat([ck, nk[:, None]], dim=2), torch.cat([cv, nv[:, None]], dim=2)
        start += a + 1
        if bonus in stop:
            break
    out.tokens = out.tokens[:max_new_tokens]
    return out


@torch.no_grad()
def autoregressive_generate(target: HFTarget, prompt_ids: list[int], max_new_tokens: int,
                            stop_ids: list[int] | tuple = ()) -> list[int]:
    """Target-only greedy decoding (the reference output for losslessness checks)."""
    dev = target.device
    cache = _new_cache(target)
    P = len(prompt_ids)
    last, _ = target.forward(torch.tensor([prompt_ids], device=dev), torch.arange(P, device=dev)[None], cache)
    tokens = [int(target.logits(last[0, -1]).argmax(-1))]
    while len(tokens) < max_new_tokens and tokens[-1] not in set(stop_ids):
        pos = P + len(tokens) - 1
        last, _ = target.forward(torch.tensor([[tokens[-1]]], device=dev), torch.tensor([[pos]], device=dev), cache)
        tokens.append(int(target.logits(last[0, -1]).argmax(-1)))
    return tokens
