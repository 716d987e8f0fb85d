"""Acceptance for ragged verify chains: greedy prefix match or rejection sampling, one program per request.

Layout. Request r verified n_r = verify_lens[r] draft tokens (0..G; NOTE: SGLang's RaggedVerifyLayout counts
the anchor too, i.e. its verify_len is n_r + 1). The target scored n_r + 1 rows [anchor, d_1..d_n], PACKED:
rows qo_indptr[r] .. qo_indptr[r+1]-1 of target_probs [T, V] / target_argmax [T], row qo_indptr[r] + i holding
the target distribution for draft token i (i = n_r: the bonus position).

Per request (T_r < 1e-5 -> greedy, else sampling; dspark-reference §3):
    greedy:   accept d_i while d_i == target_argmax[row i];  bonus = target_argmax[row a]
    sampling: accept d_i while u_i < p_i(d_i) / max(q_i(d_i), 1e-8),  u_i = uniform(seed_r, stream ACCEPT, i)
              a < n: bonus ~ normalize(max(p_a - q_a, 0)), or ~ p_a if that mass <= 1e-8
              a = n: bonus ~ p_n
              (categorical draws by Gumbel-max, noise = gumbel(seed_r, stream BONUS, v))
    q_i = softmax(draft_logits[r, i] / T_r), given as corrected logits plus their logsumexp
    (MarkovSample.logits / .lse), so no draft probability tensor [R, G, V] is materialised.
Outputs: accept_lens[r] = a (drafts accepted, bonus excluded), out_tokens[r] = [d_1..d_a, bonus, -1 ...]
of width G + 1. Stop tokens are the caller's business.
"""

from __future__ import annotations

import torch

from kernels import _rng
from kernels._rng import HAS_TRITON
from kernels.markov_sampler import GREEDY_EPS, _next_pow2

if HAS_TRITON:
    import triton
    import triton.language as tl

Q_FLOOR = 1e-8  # denominator floor for p/q, as in DeepSpec's evaluator
RESIDUAL_MASS_FLOOR = 1e-8  # below this the residual is treated as empty and the bonus comes from p


# ------------------------------------------------------------------------------------------- reference


def ragged_accept_reference(
    draft_tokens: torch.Tensor,
    verify_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    *,
    target_argmax: torch.Tensor | None = None,
    target_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    draft_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch version of the module docstring, vectorised over requests. Returns (accept_lens, out_tokens)."""
    R, G = draft_tokens.shape
    device = draft_tokens.device
    n = verify_lens.to(device=device, dtype=torch.int64)
    if bool((qo_indptr[1:] - qo_indptr[:-1] != verify_lens + 1).any()):
        raise ValueError("qo_indptr must give each request verify_lens[r] + 1 target rows")
    base = qo_indptr[:-1].to(device=device, dtype=torch.int64)
    temps = temperatures.to(device=device, dtype=torch.float32)
    greedy = temps < GREEDY_EPS
    inv_t = 1.0 / torch.where(greedy, torch.ones_like(temps), temps)
    any_sampled = bool((~greedy).any())
    if any_sampled and (target_probs is None or draft_logits is None or draft_lse is None):
        raise ValueError("sampled requests need target_probs, draft_logits and draft_lse")
    if bool(greedy.any()) and target_argmax is None:
        if target_probs is None:
            raise ValueError("greedy requests need target_argmax (or target_probs)")
        target_argmax = target_probs.argmax(dim=-1)
    seeds = seeds.to(device=device, dtype=torch.int64)
    ka1, ka2 = _rng.stream_keys_torch(seeds, _rng.SALT_ACCEPT_U)
    kb1, kb2 = _rng.stream_keys_torch(seeds, _rng.SALT_BONUS_GUMBEL)
    ar = torch.arange(R, device=device)
    num_rows = int(qo_indptr[-1])

    out = torch.full((R, G + 1), -1, dtype=torch.int64, device=device)
    a = torch.zeros(R, dtype=torch.int64, device=device)
    alive = torch.ones(R, dtype=torch.bool, device=device)
    for i in range(G):
        valid = alive & (i < n)
        row = (base + i).clamp(max=num_rows - 1)
        d = draft_tokens[:, i].to(torch.int64)
        ok = torch.zeros(R, dtype=torch.bool, device=device)
        if target_argmax is not None:
            ok = torch.where(greedy, d == target_argmax[row], ok)
        if any_sampled:
            p = target_probs[row, d].float()
            q = torch.exp(draft_logits[ar, i, d].float() * inv_t - draft_lse[:, i].float())
            u = _rng.uniform_torch(ka1, ka2, torch.full_like(ka1, i))
            ok = torch.where(greedy, ok, u < p / q.clamp(min=Q_FLOOR))
        accepted = valid & ok
        out[:, i] = torch.where(accepted, d, out[:, i])
        a += accepted.long()
        alive = accepted

    row = base + a
    bonus = torch.zeros(R, dtype=torch.int64, device=device)
    if target_argmax is not None:
        bonus = torch.where(greedy, target_argmax[row], bonus)
    if any_sampled:
        p = target_probs[row].float()  # [R, V]
        V = p.shape[1]
        a_c = a.clamp(max=G - 1)
        has_residual = a < n
        q = torch.exp(draft_logits[ar, a_c].float() * inv_t[:, None] - draft_lse[ar, a_c].float()[:, None])
        q = torch.where(has_residual[:, None], q, torch.zeros_like(q))
        residual = (p - q).clamp(min=0.0)
        mass = residual.sum(dim=-1)
        noise = _rng.gumbel_torch(kb1[:, None], kb2[:, None], torch.arange(V, device=device)[None, :])
        neg_inf = torch.full_like(p, float("-inf"))
        tok_res = torch.where(residual > 0, torch.log(residual) + noise, neg_inf).argmax(dim=-1)
        tok_p = torch.where(p > 0, torch.log(p) + noise, neg_inf).argmax(dim=-1)
        sampled = torch.where(has_residual & (mass > RESIDUAL_MASS_FLOOR), tok_res, tok_p)
        bonus = torch.where(greedy, bonus, sampled)
    out[ar, a] = bonus
    return a.to(torch.int32), out


# ---------------------------------------------------------------------------------------------- triton

if HAS_TRITON:

    @triton.jit
    def _ragged_accept_kernel(
        draft_ptr, s_draft,  # [R, G] int
        lens_ptr, indptr_ptr,  # [R], [R+1]
        temp_ptr, seed_ptr,  # [R] fp32, [R] int64
        argmax_ptr,  # [T] packed target argmax (HAS_ARGMAX)
        probs_ptr, s_probs,  # [T, V] packed target probs (HAS_PROBS)
        dlog_ptr, sd_r, sd_k,  # [R, G, V] draft corrected logits (HAS_PROBS)
        dlse_ptr, s_dlse,  # [R, G] draft logsumexp of logits / T (HAS_PROBS)
        acc_len_ptr, out_ptr, s_out,  # [R] int32, [R, G+1] int64
        G, V,
        HAS_ARGMAX: tl.constexpr, HAS_PROBS: tl.constexpr, BLOCK_V: tl.constexpr,
        SALT_U: tl.constexpr, SALT_BONUS: tl.constexpr,
        GREEDY_EPS: tl.constexpr, Q_FLOOR: tl.constexpr, MASS_FLOOR: tl.constexpr,
    ):
        r = tl.program_id(0).to(tl.int64)
        n = tl.load(lens_ptr + r).to(tl.int32)
        base = tl.load(indptr_ptr + r).to(tl.int64)
        temp = tl.load(temp_ptr + r).to(tl.float32)
        greedy = temp < GREEDY_EPS
        sampled = temp >= GREEDY_EPS
        inv_t = 1.0 / tl.where(greedy, 1.0, temp)
        seed = tl.load(seed_ptr + r).to(tl.int64)
        ka1, ka2 = _rng.stream_keys(seed, SALT_U)
        kb1, kb2 = _rng.stream_keys(seed, SALT_BONUS)

        tl.store(out_ptr + r * s_out + G, -1)
        a = n * 0
        alive = n >= 0  # scalar True
        for i in range(0, G):
            valid = alive & (i < n)
            d = tl.load(draft_ptr + r * s_draft + i, mask=i < n, other=0).to(tl.int64)
            ok = n < 0  # scalar False
            if HAS_ARGMAX:
                t_arg = tl.load(argmax_ptr + base + i, mask=valid & greedy, other=-1).to(tl.int64)
                ok = ok | (greedy & (d == t_arg))
            if HAS_PROBS:
                m = valid & sampled
                p = tl.load(probs_ptr + (base + i) * s_probs + d, mask=m, other=0.0).to(tl.float32)
                lg = tl.load(dlog_ptr + r * sd_r + i * sd_k + d, mask=m, other=0.0).to(tl.float32)
                lse = tl.load(dlse_ptr + r * s_dlse + i, mask=m, other=0.0).to(tl.float32)
                q = tl.exp(lg * inv_t - lse)
                u = _rng.uniform(ka1, ka2, n * 0 + i)  # counter as a tensor (int loop var in the interpreter)
                ok = ok | (sampled & (u < p / tl.maximum(q, Q_FLOOR)))
            accepted = valid & ok
            tl.store(out_ptr + r * s_out + i, tl.where(accepted, d, -1))
            a += accepted.to(tl.int32)
            alive = accepted

        row = base + a
        bonus = base * 0  # int64 scalar
        if HAS_ARGMAX:
            bonus = tl.load(argmax_ptr + row, mask=greedy, other=0).to(tl.int64)
        if HAS_PROBS:
            if sampled:
                has_res = a < n
                q_limit = tl.where(has_res, V, 0)  # q_a exists only after a rejection
                lse_a = tl.load(dlse_ptr + r * s_dlse + a, mask=has_res, other=0.0).to(tl.float32)
                neg_inf = tl.full([BLOCK_V], float("-inf"), tl.float32)
                best_r = tl.max(neg_inf, axis=0)  # fp32 scalars, typed for the loop carry
                best_p = tl.max(neg_inf, axis=0)
                mass = tl.sum(tl.zeros([BLOCK_V], tl.float32), axis=0)
                tok_r = bonus
                tok_p = bonus
                for v0 in range(0, V, BLOCK_V):
                    v = v0 + tl.arange(0, BLOCK_V)
                    vmask = v < V
                    p = tl.load(probs_ptr + row * s_probs + v, mask=vmask, other=0.0).to(tl.float32)
                    # (v < q_limit), not (vmask & has_res): the interpreter mangles vector & scalar masks
                    lg = tl.load(dlog_ptr + r * sd_r + a * sd_k + v, mask=v < q_limit,
                                 other=float("-inf")).to(tl.float32)
                    q = tl.exp(lg * inv_t - lse_a)
                    res = tl.maximum(p - q, 0.0)
                    mass += tl.sum(res, axis=0)
                    g = _rng.gumbel(kb1, kb2, v)
                    # log of a where-guarded argument: no log(0) evaluated in the untaken branch
                    sr = tl.where(res > 0, tl.log(tl.where(res > 0, res, 1.0)) + g, float("-inf"))
                    sp = tl.where(p > 0, tl.log(tl.where(p > 0, p, 1.0)) + g, float("-inf"))
                    tb_r = tl.max(sr, axis=0)
                    ta_r = v0 + tl.argmax(sr, axis=0)
                    tb_p = tl.max(sp, axis=0)
                    ta_p = v0 + tl.argmax(sp, axis=0)
                    tok_r = tl.where(tb_r > best_r, ta_r.to(tl.int64), tok_r)
                    best_r = tl.maximum(best_r, tb_r)
                    tok_p = tl.where(tb_p > best_p, ta_p.to(tl.int64), tok_p)
                    best_p = tl.maximum(best_p, tb_p)
                bonus = tl.where(has_res & (mass > MASS_FLOOR), tok_r, tok_p)
        tl.store(out_ptr + r * s_out + a, bonus)
        tl.store(acc_len_ptr + r, a)


def ragged_accept_triton(
    draft_tokens: torch.Tensor,
    verify_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    *,
    target_argmax: torch.Tensor | None = None,
    target_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    draft_lse: torch.Tensor | None = None,
    block_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version (CUDA, or CPU under TRITON_INTERPRET=1). No host sync: the caller guarantees the inputs
    a request's temperature needs (greedy: target_argmax; sampling: target_probs, draft_logits, draft_lse)."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not importable")
    R, G = draft_tokens.shape
    device = draft_tokens.device
    has_argmax = target_argmax is not None
    has_probs = target_probs is not None
    if has_probs and (draft_logits is None or draft_lse is None):
        raise ValueError("target_probs needs draft_logits and draft_lse")
    if not (has_argmax or has_probs):
        raise ValueError("need target_argmax and/or target_probs")
    if not has_argmax:  # greedy rows read the argmax; computing it unconditionally avoids a host sync
        target_argmax, has_argmax = target_probs.argmax(dim=-1), True
    temps = temperatures.to(device=device, dtype=torch.float32).contiguous()
    seeds = seeds.to(device=device, dtype=torch.int64).contiguous()
    lens = verify_lens.to(device=device).contiguous()
    indptr = qo_indptr.to(device=device).contiguous()
    accept_lens = torch.empty(R, dtype=torch.int32, device=device)
    out = torch.empty(R, G + 1, dtype=torch.int64, device=device)
    dummy = accept_lens
    if has_probs:
        V = target_probs.shape[1]
        probs, s_probs = target_probs, target_probs.stride(0)
        if target_probs.stride(1) != 1 or draft_logits.stride(2) != 1:
            raise ValueError("target_probs / draft_logits need a contiguous vocabulary dimension")
        dlog, sd_r, sd_k = draft_logits, draft_logits.stride(0), draft_logits.stride(1)
        dlse, s_dlse = draft_lse, draft_lse.stride(0)
    else:
        V, probs, s_probs, dlog, sd_r, sd_k, dlse, s_dlse = 1, dummy, 0, dummy, 0, 0, dummy, 0
    block_v = block_v or min(1024, max(16, _next_pow2(V)))
    _ragged_accept_kernel[(R,)](
        draft_tokens, draft_tokens.stride(0), lens, indptr, temps, seeds,
        target_argmax if has_argmax else dummy,
        probs, s_probs, dlog, sd_r, sd_k, dlse, s_dlse,
        accept_lens, out, out.stride(0),
        G, V,
        HAS_ARGMAX=has_argmax, HAS_PROBS=has_probs, BLOCK_V=block_v,
        SALT_U=_rng.SALT_ACCEPT_U, SALT_BONUS=_rng.SALT_BONUS_GUMBEL,
        GREEDY_EPS=GREEDY_EPS, Q_FLOOR=Q_FLOOR, MASS_FLOOR=RESIDUAL_MASS_FLOOR,
        num_warps=4,
    )
    return accept_lens, out


def ragged_accept(
    draft_tokens: torch.Tensor,
    verify_lens: torch.Tensor,
    qo_indptr: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    *,
    target_argmax: torch.Tensor | None = None,
    target_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    draft_lse: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton on CUDA ("auto"), torch elsewhere; backend "triton" / "torch" forces one."""
    use_triton = backend == "triton" or (backend == "auto" and HAS_TRITON and draft_tokens.device.type == "cuda")
    fn = ragged_accept_triton if use_triton else ragged_accept_reference
    return fn(draft_tokens, verify_lens, qo_indptr, temperatures, seeds, target_argmax=target_argmax,
              target_probs=target_probs, draft_logits=draft_logits, draft_lse=draft_lse)
