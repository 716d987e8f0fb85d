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

GPU paths (no host sync in either):
  greedy (no target_probs given: every request greedy): ONE launch, _ragged_accept_greedy_kernel, a
      [requests x positions] tile per program: one round of gathers (drafts, target argmax), the first stop by
      a min-reduction, one gather of the bonus argmax. Reads ~R * 2G * 8 bytes (~30 KB at R=256, G=7): the
      time is launch latency (~5 us on the GPU); the wrapper allocates the two outputs and launches, nothing
      else (no casts, no argmax, no cumsum).
  sampling (target_probs given; mixed greedy/sampled batches too): two launches.
      _ragged_accept_kernel, grid (request, vocabulary chunk): the G ratio tests of a request at once, each a
      gather of p_i(d_i) and of the draft logit of d_i (no full rows), then, for sampled requests only, the
      Gumbel-max partial of the bonus draw over its chunk of the ONE full row pair needed: p_a and, after a
      rejection, the draft logits of row a (the residual max(p_a - q_a, 0); with no rejection q is 0 and the
      residual is p_n itself, so one candidate per element). _ragged_bonus_kernel combines the chunk partials
      (and, only when a residual is empty, re-sweeps p_a for that request).
      Floor (R=256, V=151936, fp32, H200 ~4.8 TB/s): at most 2 * V * 4 B = 1.2 MB per sampled request,
      ~311 MB = ~65 us when every request rejects; the hash + 3 logs + 1 exp per element (~39 M elements)
      is ~60-90 us of CUDA-core issue, so ~100 us is the practical floor (not 20 us).
"""

from __future__ import annotations

import torch

from dspark_kernels import _rng
from dspark_kernels._rng import HAS_TRITON
from dspark_kernels.markov_sampler import GREEDY_EPS, _next_pow2

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
    def _ragged_accept_greedy_kernel(
        draft_ptr, s_draft,  # [R, G] int
        lens_ptr, indptr_ptr,  # [R], [R+1]
        argmax_ptr,  # [T] packed target argmax
        acc_len_ptr, out_ptr,  # [R] int32, [R, G+1] int64 (contiguous)
        R,
        G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_R: tl.constexpr,
    ):
        """Every request greedy: one 2-D tile [requests, positions], two rounds of gathers, no loop."""
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        n = tl.load(lens_ptr + rows, mask=rmask, other=0).to(tl.int32)
        base = tl.load(indptr_ptr + rows, mask=rmask, other=0).to(tl.int64)
        i = tl.arange(0, G_PAD)
        live = rmask[:, None] & (i[None, :] < n[:, None])
        d = tl.load(draft_ptr + rows[:, None].to(tl.int64) * s_draft + i[None, :], mask=live, other=0).to(tl.int64)
        t = tl.load(argmax_ptr + base[:, None] + i[None, :], mask=live, other=0).to(tl.int64)
        stop = (i[None, :] >= n[:, None]) | (d != t)  # first stop: a mismatch, or the bonus position n
        a = tl.min(tl.where(stop, i[None, :], G_PAD), axis=1)
        bonus = tl.load(argmax_ptr + base + a, mask=rmask, other=0).to(tl.int64)
        tok = tl.where(i[None, :] < a[:, None], d, tl.where(i[None, :] == a[:, None], bonus[:, None], -1))
        tl.store(out_ptr + rows[:, None].to(tl.int64) * (G + 1) + i[None, :], tok,
                 mask=rmask[:, None] & (i[None, :] < G + 1))
        tl.store(acc_len_ptr + rows, a, mask=rmask)

    @triton.jit
    def _ragged_accept_kernel(
        draft_ptr, s_draft,  # [R, G] int
        lens_ptr, indptr_ptr,  # [R], [R+1]
        temp_ptr, seed_ptr,  # [R] fp32, [R] int64
        argmax_ptr,  # [T] packed target argmax
        probs_ptr, s_probs,  # [T, V] packed target probs
        dlog_ptr, sd_r, sd_k,  # [R, G, V] draft corrected logits
        dlse_ptr, s_dlse,  # [R, G] draft logsumexp of logits / T
        acc_len_ptr, out_ptr,  # [R] int32, [R, G+1] int64 (contiguous)
        part_f_ptr, part_i_ptr,  # bonus partials: fp32 [2, R, S] (best score, residual mass), int32 [R, S]
        R, V, S, CHUNK,
        G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_V: tl.constexpr,
        SALT_U: tl.constexpr, SALT_BONUS: tl.constexpr, GREEDY_EPS: tl.constexpr, Q_FLOOR: tl.constexpr,
    ):
        """Program (r, s): acceptance of request r (every s recomputes it: G gathers), then, for a sampled
        request, the Gumbel-max partial of the bonus draw over vocabulary chunk s."""
        r = tl.program_id(0).to(tl.int64)
        s = tl.program_id(1)
        n = tl.load(lens_ptr + r).to(tl.int32)
        base = tl.load(indptr_ptr + r).to(tl.int64)
        temp = tl.load(temp_ptr + r).to(tl.float32)
        greedy = temp < GREEDY_EPS
        inv_t = 1.0 / tl.where(greedy, 1.0, temp)
        seed = tl.load(seed_ptr + r).to(tl.int64)

        # acceptance: all G ratio tests at once (gathers of the drafted token's p and q), first failure wins
        i = tl.arange(0, G_PAD)
        live = i < n
        d = tl.load(draft_ptr + r * s_draft + i, mask=live, other=0).to(tl.int64)
        if greedy:
            t_arg = tl.load(argmax_ptr + base + i, mask=live, other=0).to(tl.int64)
            ok = live & (d == t_arg)
        else:
            ka1, ka2 = _rng.stream_keys(seed, SALT_U)
            p = tl.load(probs_ptr + (base + i) * s_probs + d, mask=live, other=0.0).to(tl.float32)
            lg = tl.load(dlog_ptr + r * sd_r + i * sd_k + d, mask=live, other=0.0).to(tl.float32)
            lse = tl.load(dlse_ptr + r * s_dlse + i, mask=live, other=0.0).to(tl.float32)
            q = tl.exp(lg * inv_t - lse)
            u = _rng.uniform(ka1, ka2, i)
            ok = live & (u < p / tl.maximum(q, Q_FLOOR))
        a = tl.min(tl.where(ok, G_PAD, i), axis=0)  # ok is False from position n on, so a <= n
        if s == 0:
            tl.store(out_ptr + r * (G + 1) + i, tl.where(i < a, d, -1), mask=i < G + 1)
            tl.store(acc_len_ptr + r, a)

        if temp >= GREEDY_EPS:
            # residual max(p_a - q_a, 0) over this chunk; with no rejection (a = n) q is 0 and it is p_n itself
            kb1, kb2 = _rng.stream_keys(seed, SALT_BONUS)
            row = base + a
            q_limit = tl.where(a < n, V, 0)  # q_a exists only after a rejection
            lse_a = tl.load(dlse_ptr + r * s_dlse + a, mask=a < n, other=0.0).to(tl.float32)
            best = tl.max(tl.full([BLOCK_V], float("-inf"), tl.float32), axis=0)
            tok = tl.sum(tl.zeros([BLOCK_V], tl.int32), axis=0)
            mass = tl.sum(tl.zeros([BLOCK_V], tl.float32), axis=0)
            v_begin = s * CHUNK
            v_end = tl.minimum(v_begin + CHUNK, V)
            for v0 in range(v_begin, v_end, BLOCK_V):
                v = v0 + tl.arange(0, BLOCK_V)
                vmask = v < v_end
                p = tl.load(probs_ptr + row * s_probs + v, mask=vmask, other=0.0).to(tl.float32)
                # (v < q_limit), not (vmask & scalar): the interpreter mangles vector & scalar masks
                lg = tl.load(dlog_ptr + r * sd_r + a * sd_k + v, mask=v < q_limit, other=float("-inf"))
                res = tl.maximum(p - tl.exp(lg.to(tl.float32) * inv_t - lse_a), 0.0)
                res = tl.where(vmask, res, 0.0)
                mass += tl.sum(res, axis=0)
                g = _rng.gumbel(kb1, kb2, v)
                # log of a where-guarded argument: no log(0) evaluated in the untaken branch
                sc = tl.where(res > 0, tl.log(tl.where(res > 0, res, 1.0)) + g, float("-inf"))
                t_best, t_arg = tl.max(sc, axis=0, return_indices=True)
                tok = tl.where(t_best > best, v0 + t_arg, tok)
                best = tl.maximum(best, t_best)
            off = r * S + s
            tl.store(part_f_ptr + off, best)
            tl.store(part_f_ptr + R * S + off, mass)
            tl.store(part_i_ptr + off, tok)

    @triton.jit
    def _ragged_bonus_kernel(
        lens_ptr, indptr_ptr, temp_ptr, seed_ptr,
        argmax_ptr, probs_ptr, s_probs,
        acc_len_ptr, out_ptr,
        part_f_ptr, part_i_ptr,
        R, V, S,
        G: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr,
        SALT_BONUS: tl.constexpr, GREEDY_EPS: tl.constexpr, MASS_FLOOR: tl.constexpr,
    ):
        """Bonus token per request: greedy -> target argmax of row a; sampled -> combine the chunk partials
        (max score, lowest id among ties; residual mass), falling back to a draw from p_a when the residual
        mass is <= MASS_FLOOR (rare: then this program sweeps those rows once more)."""
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        n = tl.load(lens_ptr + rows, mask=rmask, other=0).to(tl.int32)
        base = tl.load(indptr_ptr + rows, mask=rmask, other=0).to(tl.int64)
        a = tl.load(acc_len_ptr + rows, mask=rmask, other=0)
        temp = tl.load(temp_ptr + rows, mask=rmask, other=0.0).to(tl.float32)
        greedy = temp < GREEDY_EPS
        sampled = rmask & (temp >= GREEDY_EPS)
        row = base + a
        bonus = tl.load(argmax_ptr + row, mask=rmask & greedy, other=0).to(tl.int64)

        j = tl.arange(0, BLOCK_S)
        m2 = sampled[:, None] & (j < S)[None, :]
        off = rows[:, None] * S + j[None, :]
        sc = tl.load(part_f_ptr + off, mask=m2, other=float("-inf"))
        ms = tl.load(part_f_ptr + R * S + off, mask=m2, other=0.0)
        idx = tl.load(part_i_ptr + off, mask=m2, other=0)
        best = tl.max(sc, axis=1)
        tok_res = tl.min(tl.where(m2 & (sc == best[:, None]), idx, 2147483647), axis=1)
        mass = tl.sum(ms, axis=1)
        fallback = sampled & (a < n) & (mass <= MASS_FLOOR)
        bonus = tl.where(sampled, tok_res.to(tl.int64), bonus)

        if tl.max(fallback.to(tl.int32), axis=0) > 0:  # residual empty: draw from p_a instead
            seed = tl.load(seed_ptr + rows, mask=rmask, other=0).to(tl.int64)
            kb1, kb2 = _rng.stream_keys(seed, SALT_BONUS)
            best_p = tl.full([BLOCK_R], float("-inf"), tl.float32)
            tok_p = tl.zeros([BLOCK_R], tl.int32)
            for v0 in range(0, V, BLOCK_V):
                v = v0 + tl.arange(0, BLOCK_V)
                pm = fallback[:, None] & (v < V)[None, :]
                p = tl.load(probs_ptr + row[:, None] * s_probs + v[None, :], mask=pm, other=0.0).to(tl.float32)
                g = _rng.gumbel(kb1[:, None], kb2[:, None], v[None, :])
                sp = tl.where(p > 0, tl.log(tl.where(p > 0, p, 1.0)) + g, float("-inf"))
                t_best, t_arg = tl.max(sp, axis=1, return_indices=True)
                tok_p = tl.where(t_best > best_p, v0 + t_arg, tok_p)
                best_p = tl.maximum(best_p, t_best)
            bonus = tl.where(fallback, tok_p.to(tl.int64), bonus)
        tl.store(out_ptr + rows.to(tl.int64) * (G + 1) + a, bonus, mask=rmask)


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # the CPU interpreter: still split the vocabulary, so the partial combine is exercised
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


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
    splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version (CUDA, or CPU under TRITON_INTERPRET=1). No host sync; the caller guarantees the inputs
    a request's temperature needs (greedy: target_argmax; sampling: target_probs, draft_logits, draft_lse).

    Without target_probs every request is accepted greedily (temperatures and seeds are not read): one launch
    of _ragged_accept_greedy_kernel. With target_probs: _ragged_accept_kernel over (request, vocabulary
    chunk), `splits` chunks per request, then _ragged_bonus_kernel."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not importable")
    R, G = draft_tokens.shape
    device = draft_tokens.device
    has_probs = target_probs is not None
    if has_probs and (draft_logits is None or draft_lse is None):
        raise ValueError("target_probs needs draft_logits and draft_lse")
    if target_argmax is None and not has_probs:
        raise ValueError("need target_argmax and/or target_probs")
    # no-ops (no copy, no launch) for the expected inputs: contiguous index tensors on the drafts' device
    verify_lens = verify_lens.to(device).contiguous()
    qo_indptr = qo_indptr.to(device).contiguous()
    accept_lens = torch.empty(R, dtype=torch.int32, device=device)
    out = torch.empty(R, G + 1, dtype=torch.int64, device=device)
    g_pad = max(2, _next_pow2(G + 1))
    if not has_probs:  # greedy batch: no casts, no extra allocation, one launch
        block_r = min(128, max(16, _next_pow2(R)))
        _ragged_accept_greedy_kernel[(triton.cdiv(R, block_r),)](
            draft_tokens, draft_tokens.stride(0), verify_lens, qo_indptr, target_argmax.contiguous(),
            accept_lens, out, R,
            G=G, G_PAD=g_pad, BLOCK_R=block_r, num_warps=4,
        )
        return accept_lens, out

    if target_argmax is None:  # greedy rows read the argmax; computing it unconditionally avoids a host sync
        target_argmax = target_probs.argmax(dim=-1)
    temps = temperatures.to(device=device, dtype=torch.float32).contiguous()
    seeds = seeds.to(device=device, dtype=torch.int64).contiguous()
    target_argmax = target_argmax.contiguous()
    V = target_probs.shape[1]
    if target_probs.stride(1) != 1 or draft_logits.stride(2) != 1:
        raise ValueError("target_probs / draft_logits need a contiguous vocabulary dimension")
    block_v = block_v or min(1024, max(16, _next_pow2(V)))
    if splits is None:  # ~8 programs per SM in all
        splits = triton.cdiv(8 * _sm_count(device), max(1, R))
    chunk = triton.cdiv(triton.cdiv(V, max(1, splits)), block_v) * block_v
    S = triton.cdiv(V, chunk)
    part_f = torch.empty(2, R, S, dtype=torch.float32, device=device)
    part_i = torch.empty(R, S, dtype=torch.int32, device=device)
    _ragged_accept_kernel[(R, S)](
        draft_tokens, draft_tokens.stride(0), verify_lens, qo_indptr, temps, seeds, target_argmax,
        target_probs, target_probs.stride(0), draft_logits, draft_logits.stride(0), draft_logits.stride(1),
        draft_lse, draft_lse.stride(0), accept_lens, out, part_f, part_i,
        R, V, S, chunk,
        G=G, G_PAD=g_pad, BLOCK_V=block_v,
        SALT_U=_rng.SALT_ACCEPT_U, SALT_BONUS=_rng.SALT_BONUS_GUMBEL, GREEDY_EPS=GREEDY_EPS, Q_FLOOR=Q_FLOOR,
        num_warps=4,
    )
    block_r = 32
    _ragged_bonus_kernel[(triton.cdiv(R, block_r),)](
        verify_lens, qo_indptr, temps, seeds, target_argmax, target_probs, target_probs.stride(0),
        accept_lens, out, part_f, part_i,
        R, V, S,
        G=G, BLOCK_R=block_r, BLOCK_S=max(2, _next_pow2(S)), BLOCK_V=min(256, block_v),
        SALT_BONUS=_rng.SALT_BONUS_GUMBEL, GREEDY_EPS=GREEDY_EPS, MASS_FLOOR=RESIDUAL_MASS_FLOOR,
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
