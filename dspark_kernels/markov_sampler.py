"""Markov-head draft sampling: corrected logits, Gumbel-max sampling, draft probabilities, Markov embeddings.

Semantics (dspark-reference §1.6, vanilla head), for request r and position k = 0..G-1:
    prev_0 = anchor[r], prev_k = tokens[r, k-1]
    e_k      = W1[prev_k]                              -> markov_emb[r, k]   (confidence-head input)
    logits_k = U[r, k] + W2 @ e_k                      -> logits[r, k]       (fp32, before temperature)
    z_k      = logits_k / T_r        (T_r < 1e-5: greedy, z_k = logits_k)
    tokens[r, k] = argmax_v(z_k[v] + gumbel(seed_r, k * V + v))   (greedy: no noise; ties -> lowest id)
    lse[r, k]    = logsumexp(z_k)
    token_probs[r, k] = softmax(z_k)[tokens[r, k]]      (greedy: 1.0, the one-hot draft distribution)

The Gumbel noise comes from dspark_kernels/_rng.py, which the torch reference reproduces bit for bit.

GPU design: two launches per position k, 2*G in all, no host sync, CUDA-graph capturable.
  step   grid (request tiles, P vocabulary programs). A program loads e_k = W1[prev] for its BLOCK_R requests
         once, then walks a contiguous run of vocabulary tiles: logits = e_k @ W2[tile]^T on tensor cores
         (tl.dot, fp32 accumulation; W2 streamed once per request tile, the other request tiles of the same
         vocabulary run hit L2), + U[:, k, tile], and an epilogue in registers that adds the Gumbel noise and
         keeps per-row running (best score, its token, max z, sum exp(z - max)). Only those four numbers per
         (request, program) leave the program: [R, P] partials, P ~ 2 * SMs / request tiles.
  reduce grid (request blocks). Picks the token (max score; lowest id among equal maxima, as torch.argmax),
         lse = logsumexp of the partials, and the token's probability exp(z_tok - lse), z_tok recovered as
         score - gumbel(token) (within one ulp of the score). Its tokens are `prev` of the next step.
Why not one launch per block (G positions in one kernel): position k+1 needs token k, a max over the whole
vocabulary, i.e. a grid-wide dependency; a single program per request (the only barrier-free single launch)
does the rank x V projection on CUDA cores one request at a time, and tensor cores need many requests per
program. Two launches per position cost ~2 us of launch gap each (14 in all at G = 7) against ~50 us of work.
Cost model (R=128, G=7, V=151936, r=256, bf16, H200): W2 7 x 78 MB + U 272 MB (+ logits 545 MB fp32) of HBM
traffic, 70 GFLOP on tensor cores, and ~136 M Gumbel draws (two 32-bit hash rounds + two logs each) on CUDA
cores: ~0.25 ms without logits, ~0.35 ms with, by bandwidth / issue rate. A batch the caller knows to be all
greedy (the server drafts greedily by default) compiles the draws out (SAMPLED=False).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from dspark_kernels import _rng
from dspark_kernels._rng import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

GREEDY_EPS = 1e-5  # temperatures below this sample greedily (as DeepSpec's evaluator does)
HEAD_KINDS = ("vanilla", "gated", "rnn")


@dataclass
class MarkovSample:
    tokens: torch.Tensor  # [R, G] int64
    token_probs: torch.Tensor  # [R, G] fp32, draft prob of each sampled token (1.0 when greedy)
    markov_emb: torch.Tensor  # [R, G, r] W1 dtype, e_k = W1[prev_k]
    lse: torch.Tensor  # [R, G] fp32, logsumexp(logits_k / T) (greedy rows: logsumexp(logits_k))
    logits: torch.Tensor | None  # [R, G, V] fp32 corrected logits before temperature, when asked for
    backend: str  # "triton" or "torch"
    reason: str  # why this backend was chosen


def _inv_temperature(temperatures: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t = temperatures.to(torch.float32)
    greedy = t < GREEDY_EPS
    inv_t = 1.0 / torch.where(greedy, torch.ones_like(t), t)
    return inv_t, greedy


# ------------------------------------------------------------------------------------------- reference


def _head_correction(kind, k, e, w2, hidden, gate_proj, joint_proj, state):
    """W2 @ (head input) for one position; returns (correction [R, V] fp32, new rnn state)."""
    w2f = w2.float()
    ef = e.float()
    if kind == "vanilla":
        return ef @ w2f.T, state
    h = hidden[:, k].float()
    if kind == "gated":
        gw, gb = gate_proj
        g = torch.sigmoid(torch.cat([h, ef], dim=-1) @ gw.float().T + gb.float())
        return (g * ef) @ w2f.T, state
    jw, jb = joint_proj  # rnn: z = [s_{k-1}; e_k; h_k] -> (a_g, a_c, a_o)
    a_g, a_c, a_o = (torch.cat([state, ef, h], dim=-1) @ jw.float().T + jb.float()).chunk(3, dim=-1)
    gate = torch.sigmoid(a_g)
    state = gate * state + (1.0 - gate) * torch.tanh(a_c)
    return torch.tanh(a_o) @ w2f.T, state


def markov_sample_reference(
    base_logits: torch.Tensor,
    markov_w1: torch.Tensor,
    markov_w2: torch.Tensor,
    anchor_tokens: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    *,
    return_logits: bool = False,
    head_kind: str = "vanilla",
    hidden: torch.Tensor | None = None,
    gate_proj: tuple[torch.Tensor, torch.Tensor] | None = None,
    joint_proj: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> MarkovSample:
    """Torch loop over the G positions with the exact semantics of the module docstring.

    Gated / rnn heads need `hidden` [R, G, d] (final-normed draft hidden states) and their projection
    (weight, bias): gate_proj = Linear(d+r -> r), joint_proj = Linear(2r+d -> 3r).
    """
    if head_kind not in HEAD_KINDS:
        raise ValueError(f"unknown Markov head kind {head_kind!r}; expected one of {HEAD_KINDS}")
    R, G, V = base_logits.shape
    rank = markov_w1.shape[1]
    device = base_logits.device
    inv_t, greedy = _inv_temperature(temperatures.to(device))
    key1, key2 = _rng.stream_keys_torch(seeds.to(device), _rng.SALT_DRAFT_GUMBEL)
    vocab = torch.arange(V, device=device, dtype=torch.int64)

    tokens = torch.empty(R, G, dtype=torch.int64, device=device)
    probs = torch.empty(R, G, dtype=torch.float32, device=device)
    lse = torch.empty(R, G, dtype=torch.float32, device=device)
    emb = torch.empty(R, G, rank, dtype=markov_w1.dtype, device=device)
    logits_out = torch.empty(R, G, V, dtype=torch.float32, device=device) if return_logits else None
    state = torch.zeros(R, rank, dtype=torch.float32, device=device)  # rnn state, fresh per block

    prev = anchor_tokens.to(device=device, dtype=torch.int64)
    for k in range(G):
        e = markov_w1[prev]
        emb[:, k] = e
        corr, state = _head_correction(head_kind, k, e, markov_w2, hidden, gate_proj, joint_proj, state)
        logits = base_logits[:, k].float() + corr
        if logits_out is not None:
            logits_out[:, k] = logits
        z = logits * inv_t[:, None]
        noise = _rng.gumbel_torch(key1[:, None], key2[:, None], k * V + vocab[None, :])
        score = torch.where(greedy[:, None], z, z + noise)
        tok = score.argmax(dim=-1)
        lse_k = torch.logsumexp(z, dim=-1)
        z_tok = z.gather(1, tok[:, None]).squeeze(1)
        tokens[:, k] = tok
        lse[:, k] = lse_k
        probs[:, k] = torch.where(greedy, torch.ones_like(lse_k), torch.exp(z_tok - lse_k))
        prev = tok
    return MarkovSample(tokens, probs, emb, lse, logits_out, "torch", "reference")


# ---------------------------------------------------------------------------------------------- triton

if HAS_TRITON:

    @triton.jit
    def _markov_step_kernel(
        u_ptr, su_r, su_k, su_v,  # base logits U [R, G, V]
        w1_ptr, w2_ptr,  # W1 [V, RANK], W2 [V, RANK], contiguous rows
        prev_ptr, s_prev,  # prev tokens [R] (anchor, or tokens[:, k-1])
        temp_ptr, seed_ptr,  # [R] fp32, [R] int64
        emb_ptr, se_r, se_k,  # markov_emb [R, G, RANK]
        logits_ptr, sl_r, sl_k,  # corrected logits [R, G, V] fp32 (written when WRITE_LOGITS)
        part_f_ptr, part_i_ptr,  # partials: fp32 [3, R, P] (best score, max z, sum exp), int32 [R, P] (token)
        k, R, V, NT, P, TILES_PER_PROG,
        RANK: tl.constexpr, RANK_PAD: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
        WRITE_LOGITS: tl.constexpr, IEEE_DOT: tl.constexpr, SAMPLED: tl.constexpr,
        SALT: tl.constexpr, GREEDY_EPS: tl.constexpr,
    ):
        """One program = one request tile x a contiguous run of TILES_PER_PROG vocabulary tiles.
        SAMPLED=False: every row is greedy (the caller knows it on the host), so no Gumbel noise is drawn."""
        pid_r = tl.program_id(0)  # request tiles vary fastest: programs sharing W2 tiles run together
        pid_v = tl.program_id(1)
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        kk = tl.arange(0, RANK_PAD)
        kmask = kk < RANK

        # e_k = W1[prev] for the whole request tile, loaded once and reused for every vocabulary tile
        prev = tl.load(prev_ptr + rows * s_prev, mask=rmask, other=0).to(tl.int64)
        e = tl.load(w1_ptr + prev[:, None] * RANK + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        if pid_v == 0:  # one vocabulary program writes the Markov embedding
            tl.store(emb_ptr + rows[:, None].to(tl.int64) * se_r + k * se_k + kk[None, :], e,
                     mask=rmask[:, None] & kmask[None, :])
        if IEEE_DOT:  # fp32 weights, or the CPU interpreter (its bf16 dot is wrong): exact fp32 dot
            e = e.to(tl.float32)

        temp = tl.load(temp_ptr + rows, mask=rmask, other=1.0).to(tl.float32)
        greedy = temp < GREEDY_EPS
        inv_t = 1.0 / tl.where(greedy, 1.0, temp)
        seed = tl.load(seed_ptr + rows, mask=rmask, other=0).to(tl.int64)
        key1, key2 = _rng.stream_keys(seed, SALT)
        u_row = u_ptr + rows.to(tl.int64) * su_r + k * su_k
        l_row = logits_ptr + rows.to(tl.int64) * sl_r + k * sl_k

        run_best = tl.full([BLOCK_R], float("-inf"), tl.float32)
        run_tok = tl.zeros([BLOCK_R], tl.int32)
        run_m = tl.full([BLOCK_R], float("-inf"), tl.float32)
        run_s = tl.zeros([BLOCK_R], tl.float32)
        t_begin = pid_v * TILES_PER_PROG
        t_end = tl.minimum(t_begin + TILES_PER_PROG, NT)
        for t in range(t_begin, t_end):
            v0 = t * BLOCK_V
            cols = v0 + tl.arange(0, BLOCK_V)
            cmask = cols < V
            w = tl.load(w2_ptr + cols[:, None].to(tl.int64) * RANK + kk[None, :],
                        mask=cmask[:, None] & kmask[None, :], other=0.0)  # [BLOCK_V, RANK_PAD]
            if IEEE_DOT:
                acc = tl.dot(e, tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc = tl.dot(e, tl.trans(w))  # tensor cores, fp32 accumulation
            m2 = rmask[:, None] & cmask[None, :]
            u = tl.load(u_row[:, None] + cols[None, :] * su_v, mask=m2, other=0.0)
            logits = acc + u.to(tl.float32)
            if WRITE_LOGITS:
                tl.store(l_row[:, None] + cols[None, :], logits, mask=m2)

            z = logits * inv_t[:, None]
            if SAMPLED:
                noise = _rng.gumbel(key1[:, None], key2[:, None], k * V + cols[None, :])
                score = tl.where(greedy[:, None], z, z + noise)
            else:
                score = z
            score = tl.where(cmask[None, :], score, float("-inf"))
            z = tl.where(cmask[None, :], z, float("-inf"))

            t_best, t_arg = tl.max(score, axis=1, return_indices=True)  # ties -> lowest index in the tile
            better = t_best > run_best  # strict: earlier tiles (lower ids) keep ties
            run_tok = tl.where(better, v0 + t_arg, run_tok)
            run_best = tl.where(better, t_best, run_best)
            m_new = tl.maximum(run_m, tl.max(z, axis=1))  # every tile holds >= 1 valid column: finite
            run_s = run_s * tl.exp(run_m - m_new) + tl.sum(tl.exp(z - m_new[:, None]), axis=1)
            run_m = m_new

        p_off = rows * P + pid_v
        rp = R * P
        tl.store(part_f_ptr + p_off, run_best, mask=rmask)
        tl.store(part_f_ptr + rp + p_off, run_m, mask=rmask)
        tl.store(part_f_ptr + 2 * rp + p_off, run_s, mask=rmask)
        tl.store(part_i_ptr + p_off, run_tok, mask=rmask)

    @triton.jit
    def _markov_reduce_kernel(
        part_f_ptr, part_i_ptr,  # partials of _markov_step_kernel
        temp_ptr, seed_ptr,
        tok_ptr, prob_ptr, lse_ptr, s_out,  # outputs [R, G] (row stride s_out) at column k
        k, R, V, P,
        BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, SAMPLED: tl.constexpr,
        SALT: tl.constexpr, GREEDY_EPS: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        p = tl.arange(0, BLOCK_P)
        m2 = rmask[:, None] & (p < P)[None, :]
        off = rows[:, None] * P + p[None, :]
        rp = R * P
        score = tl.load(part_f_ptr + off, mask=m2, other=float("-inf"))
        m = tl.load(part_f_ptr + rp + off, mask=m2, other=float("-inf"))
        s = tl.load(part_f_ptr + 2 * rp + off, mask=m2, other=0.0)
        idx = tl.load(part_i_ptr + off, mask=m2, other=0)

        best = tl.max(score, axis=1)
        # lowest token id among equal maxima (greedy rows can tie exactly), as torch.argmax picks
        tok = tl.min(tl.where(m2 & (score == best[:, None]), idx, 2147483647), axis=1)
        tok = tl.where(rmask, tok, 0)
        mx = tl.where(rmask, tl.max(m, axis=1), 0.0)  # padded rows: no partials at all
        tot = tl.sum(tl.where(m2, s * tl.exp(m - mx[:, None]), 0.0), axis=1)
        lse = mx + tl.log(tl.where(rmask, tot, 1.0))

        temp = tl.load(temp_ptr + rows, mask=rmask, other=1.0).to(tl.float32)
        greedy = temp < GREEDY_EPS
        seed = tl.load(seed_ptr + rows, mask=rmask, other=0).to(tl.int64)
        key1, key2 = _rng.stream_keys(seed, SALT)
        # z of the sampled token, recovered from its perturbed score (|error| <= one ulp of the score): the
        # vocabulary sweep then needs no per-element bookkeeping of z at the running argmax
        if SAMPLED:
            z_tok = tl.where(rmask, best - _rng.gumbel(key1, key2, k * V + tok), 0.0)
            prob = tl.where(greedy, 1.0, tl.exp(tl.where(rmask, z_tok - lse, 0.0)))
        else:
            prob = tl.full([BLOCK_R], 1.0, tl.float32)
        out = rows * s_out + k
        tl.store(tok_ptr + out, tok.to(tl.int64), mask=rmask)
        tl.store(prob_ptr + out, prob, mask=rmask)
        tl.store(lse_ptr + out, lse, mask=rmask)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


_SM_COUNT: dict[int, int] = {}


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # the CPU interpreter: a couple of vocabulary programs, so the cross-program reduce is exercised
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def markov_launch_config(R: int, V: int, rank: int, device: torch.device, *, block_r: int | None = None,
                         block_v: int | None = None, programs_v: int | None = None, num_warps: int | None = None,
                         num_stages: int | None = None) -> dict:
    """Tile sizes and grid of the step kernel (defaults tuned for H100/H200-class GPUs; all overridable)."""
    block_r = block_r or min(64, max(16, _next_pow2(R)))
    block_v = block_v or (64 if V >= 64 else max(16, _next_pow2(V)))
    num_warps = num_warps or (8 if block_r * block_v >= 128 * 128 else 4)
    num_stages = num_stages or 2  # a W2 tile is block_v x rank (32 KB at 64 x 256 bf16): 2 buffers suffice
    for name, b in (("block_r", block_r), ("block_v", block_v)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot tiles); got {b}")
    nt = triton.cdiv(V, block_v)
    r_tiles = triton.cdiv(R, block_r)
    if programs_v is None:  # about two resident programs per SM in all, each a contiguous run of vocab tiles
        programs_v = triton.cdiv(2 * _sm_count(device), r_tiles)
    programs_v = max(1, min(nt, programs_v))
    tiles_per_prog = triton.cdiv(nt, programs_v)
    programs_v = triton.cdiv(nt, tiles_per_prog)  # no program without a tile
    return dict(block_r=block_r, block_v=block_v, rank_pad=max(16, _next_pow2(rank)), num_warps=num_warps,
                num_stages=num_stages, nt=nt, r_tiles=r_tiles, programs_v=programs_v, tiles_per_prog=tiles_per_prog)


def markov_sample_triton(
    base_logits: torch.Tensor,
    markov_w1: torch.Tensor,
    markov_w2: torch.Tensor,
    anchor_tokens: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    *,
    return_logits: bool = False,
    block_r: int | None = None,
    block_v: int | None = None,
    programs_v: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    all_greedy: bool | None = None,
) -> MarkovSample:
    """Vanilla head on Triton (CUDA, or CPU under TRITON_INTERPRET=1). Same outputs as the reference.

    all_greedy: the caller's host-side knowledge (it must be true) that every temperature is below GREEDY_EPS
    (the server's default greedy drafts); the kernels then skip the Gumbel draws, two hash rounds and two logs per
    vocabulary entry. None reads it from `temperatures` when they are on the host, and otherwise assumes sampling
    rather than sync."""
    if not HAS_TRITON:
        raise RuntimeError("triton is not importable")
    R, G, V = base_logits.shape
    rank = markov_w1.shape[1]
    if markov_w2.shape != (V, rank) or markov_w1.shape[0] != V:
        raise ValueError(f"expected W1 [V, r] and W2 [V, r] with V={V}; got {tuple(markov_w1.shape)}, "
                         f"{tuple(markov_w2.shape)}")
    if markov_w1.dtype != markov_w2.dtype:
        raise ValueError("markov_w1 and markov_w2 must share a dtype")
    device = base_logits.device
    if all_greedy is None:
        all_greedy = temperatures.device.type == "cpu" and bool((temperatures < GREEDY_EPS).all())
    w1 = markov_w1.contiguous()
    w2 = markov_w2.contiguous()
    temps = temperatures.to(device=device, dtype=torch.float32).contiguous()
    seeds = seeds.to(device=device, dtype=torch.int64).contiguous()
    anchor = anchor_tokens.to(device=device, dtype=torch.int64).contiguous()
    cfg = markov_launch_config(R, V, rank, device, block_r=block_r, block_v=block_v, programs_v=programs_v,
                               num_warps=num_warps, num_stages=num_stages)
    P = cfg["programs_v"]

    tokens = torch.empty(R, G, dtype=torch.int64, device=device)
    probs = torch.empty(R, G, dtype=torch.float32, device=device)
    lse = torch.empty(R, G, dtype=torch.float32, device=device)
    emb = torch.empty(R, G, rank, dtype=w1.dtype, device=device)
    logits = torch.empty(R, G, V, dtype=torch.float32, device=device) if return_logits else None
    logits_arg = logits if logits is not None else probs  # dummy pointer, never written
    sl = (logits.stride(0), logits.stride(1)) if logits is not None else (0, 0)
    part_f = torch.empty(3, R, P, dtype=torch.float32, device=device)
    part_i = torch.empty(R, P, dtype=torch.int32, device=device)
    block_p = max(16, _next_pow2(P))
    reduce_block_r = max(1, min(16, 4096 // block_p))

    grid_step = (cfg["r_tiles"], P)
    grid_reduce = (triton.cdiv(R, reduce_block_r),)
    ieee = w1.dtype == torch.float32 or _interpreting()
    for k in range(G):
        prev, s_prev = (anchor, 1) if k == 0 else (tokens[:, k - 1], tokens.stride(0))
        _markov_step_kernel[grid_step](
            base_logits, base_logits.stride(0), base_logits.stride(1), base_logits.stride(2),
            w1, w2, prev, s_prev, temps, seeds,
            emb, emb.stride(0), emb.stride(1),
            logits_arg, sl[0], sl[1],
            part_f, part_i,
            k, R, V, cfg["nt"], P, cfg["tiles_per_prog"],
            RANK=rank, RANK_PAD=cfg["rank_pad"], BLOCK_R=cfg["block_r"], BLOCK_V=cfg["block_v"],
            WRITE_LOGITS=logits is not None, IEEE_DOT=ieee, SAMPLED=not all_greedy,
            SALT=_rng.SALT_DRAFT_GUMBEL, GREEDY_EPS=GREEDY_EPS,
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        )
        _markov_reduce_kernel[grid_reduce](
            part_f, part_i, temps, seeds,
            tokens, probs, lse, tokens.stride(0),
            k, R, V, P,
            BLOCK_R=reduce_block_r, BLOCK_P=block_p, SAMPLED=not all_greedy,
            SALT=_rng.SALT_DRAFT_GUMBEL, GREEDY_EPS=GREEDY_EPS,
            num_warps=4,
        )
    return MarkovSample(tokens, probs, emb, lse, logits, "triton", "vanilla head on a triton device")


# ------------------------------------------------------------------------------------------ dispatcher


def markov_sample(
    base_logits: torch.Tensor,
    markov_w1: torch.Tensor,
    markov_w2: torch.Tensor,
    anchor_tokens: torch.Tensor,
    temperatures: torch.Tensor,
    seeds: torch.Tensor,
    *,
    return_logits: bool = False,
    head_kind: str = "vanilla",
    hidden: torch.Tensor | None = None,
    gate_proj: tuple[torch.Tensor, torch.Tensor] | None = None,
    joint_proj: tuple[torch.Tensor, torch.Tensor] | None = None,
    backend: str = "auto",
    all_greedy: bool | None = None,
) -> MarkovSample:
    """Triton for the vanilla head on CUDA, torch otherwise; `.backend` / `.reason` say which and why.

    backend: "auto" | "triton" | "torch". "triton" on CPU tensors needs TRITON_INTERPRET=1 (tests only).
    all_greedy: see markov_sample_triton (the torch loop does not need it).
    """
    reason = None
    if backend == "torch":
        reason = "torch requested"
    elif head_kind != "vanilla":
        reason = f"{head_kind} Markov head has no Triton kernel (vanilla only); torch loop used"
    elif not HAS_TRITON:
        reason = "triton is not importable; torch loop used"
    elif backend == "auto" and base_logits.device.type != "cuda":
        reason = f"tensors on {base_logits.device.type}, Triton path needs CUDA; torch loop used"
    if reason is None:
        return markov_sample_triton(base_logits, markov_w1, markov_w2, anchor_tokens, temperatures, seeds,
                                    return_logits=return_logits, all_greedy=all_greedy)
    if backend == "triton" and head_kind != "vanilla":
        raise ValueError(reason)
    out = markov_sample_reference(base_logits, markov_w1, markov_w2, anchor_tokens, temperatures, seeds,
                                  return_logits=return_logits, head_kind=head_kind, hidden=hidden,
                                  gate_proj=gate_proj, joint_proj=joint_proj)
    out.reason = reason
    return out
