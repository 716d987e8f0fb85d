"""Markov-head draft sampling: corrected logits, Gumbel-max sampling, draft probabilities, Markov embeddings.

Semantics (dspark-reference §1.6, vanilla head), for request r and position k = 0..G-1:
    prev_0 = anchor[r], prev_k = tokens[r, k-1]
    e_k      = W1[prev_k]                              -> markov_emb[r, k]   (confidence-head input)
    logits_k = U[r, k] + W2 @ e_k                      -> logits[r, k]       (fp32, before temperature)
    z_k      = logits_k / T_r        (T_r < 1e-5: greedy, z_k = logits_k)
    tokens[r, k] = argmax_v(z_k[v] + gumbel(seed_r, k * V + v))   (greedy: no noise; ties -> lowest id)
    lse[r, k]    = logsumexp(z_k)
    token_probs[r, k] = softmax(z_k)[tokens[r, k]]      (greedy: 1.0, the one-hot draft distribution)

The Gumbel noise comes from kernels/_rng.py, which the torch reference reproduces bit for bit.

GPU design. The recurrence prev_k -> token_k is sequential, but within a step every request needs the same
W2 [V, r]: the Triton path runs, per step, a GEMM-shaped kernel over (request tile, vocab tile) whose epilogue
adds U, applies temperature and Gumbel noise and keeps per-tile (max, argmax, online logsumexp) partials, then a
small reduce kernel per request tile picks the token. W2 is streamed once per step for a whole request tile
(tensor cores), instead of once per request as a one-program-per-request loop would (V*r FMAs per request per
step on CUDA cores). 2*G launches, no host sync, CUDA-graph capturable.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from kernels import _rng
from kernels._rng import HAS_TRITON

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
        w1_ptr, s_w1,  # W1 [V, rank]
        w2_ptr, s_w2,  # W2 [V, rank]
        prev_ptr, s_prev,  # prev tokens [R] (anchor, or tokens[:, k-1])
        temp_ptr, seed_ptr,  # [R], [R]
        emb_ptr, se_r, se_k,  # markov_emb [R, G, rank]
        logits_ptr, sl_r, sl_k,  # corrected logits [R, G, V] fp32 (written when WRITE_LOGITS)
        part_score_ptr, part_idx_ptr, part_z_ptr, part_m_ptr, part_s_ptr,  # partials [R, NT]
        k, R, V, NT,
        RANK: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
        WRITE_LOGITS: tl.constexpr, IEEE_DOT: tl.constexpr,
        SALT: tl.constexpr, GREEDY_EPS: tl.constexpr,
    ):
        pid_r = tl.program_id(0)  # request tiles vary fastest: programs sharing a W2 tile run together
        pid_v = tl.program_id(1)
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        cmask = cols < V

        prev = tl.load(prev_ptr + rows * s_prev, mask=rmask, other=0).to(tl.int64)
        acc = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
        for r0 in range(0, RANK, BLOCK_K):
            kk = r0 + tl.arange(0, BLOCK_K)
            kmask = kk < RANK
            e = tl.load(w1_ptr + prev[:, None] * s_w1 + kk[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            w = tl.load(w2_ptr + cols[None, :].to(tl.int64) * s_w2 + kk[:, None],
                        mask=kmask[:, None] & cmask[None, :], other=0.0)
            if IEEE_DOT:  # fp32 weights, or the CPU interpreter (its bf16 dot is wrong): exact fp32 dot
                acc = tl.dot(e.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(e, w, acc)
            if pid_v == 0:  # one vocab tile writes the Markov embedding e_k
                tl.store(emb_ptr + rows[:, None] * se_r + k * se_k + kk[None, :], e,
                         mask=rmask[:, None] & kmask[None, :])

        m2 = rmask[:, None] & cmask[None, :]
        u = tl.load(u_ptr + rows[:, None].to(tl.int64) * su_r + k * su_k + cols[None, :] * su_v,
                    mask=m2, other=0.0)
        logits = acc + u.to(tl.float32)
        if WRITE_LOGITS:
            tl.store(logits_ptr + rows[:, None].to(tl.int64) * sl_r + k * sl_k + cols[None, :], logits, mask=m2)

        temp = tl.load(temp_ptr + rows, mask=rmask, other=1.0).to(tl.float32)
        greedy = temp < GREEDY_EPS
        inv_t = 1.0 / tl.where(greedy, 1.0, temp)
        seed = tl.load(seed_ptr + rows, mask=rmask, other=0).to(tl.int64)
        key1, key2 = _rng.stream_keys(seed, SALT)
        z = logits * inv_t[:, None]
        noise = _rng.gumbel(key1[:, None], key2[:, None], k * V + cols[None, :])
        score = tl.where(greedy[:, None], z, z + noise)
        score = tl.where(cmask[None, :], score, float("-inf"))
        z = tl.where(cmask[None, :], z, float("-inf"))

        best = tl.max(score, axis=1)
        arg = tl.argmax(score, axis=1)  # first maximum: ties go to the lowest token id
        local = tl.arange(0, BLOCK_V)
        z_best = tl.max(tl.where(local[None, :] == arg[:, None], z, float("-inf")), axis=1)
        m = tl.max(z, axis=1)
        s = tl.sum(tl.exp(z - m[:, None]), axis=1)

        p_off = rows * NT + pid_v
        tl.store(part_score_ptr + p_off, best, mask=rmask)
        tl.store(part_idx_ptr + p_off, pid_v * BLOCK_V + arg, mask=rmask)
        tl.store(part_z_ptr + p_off, z_best, mask=rmask)
        tl.store(part_m_ptr + p_off, m, mask=rmask)
        tl.store(part_s_ptr + p_off, s, mask=rmask)

    @triton.jit
    def _markov_reduce_kernel(
        part_score_ptr, part_idx_ptr, part_z_ptr, part_m_ptr, part_s_ptr,
        temp_ptr, tok_ptr, prob_ptr, lse_ptr, s_out,  # outputs [R, G] (row stride s_out) at column k
        k, R, NT,
        BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr, GREEDY_EPS: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < R
        run_best = tl.full([BLOCK_R], float("-inf"), tl.float32)
        run_tok = tl.zeros([BLOCK_R], tl.int32)
        run_z = tl.zeros([BLOCK_R], tl.float32)
        run_m = tl.full([BLOCK_R], -1e30, tl.float32)  # finite: no (-inf) - (-inf) on padded rows
        run_s = tl.zeros([BLOCK_R], tl.float32)
        for t0 in range(0, NT, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            m2 = rmask[:, None] & (t < NT)[None, :]
            off = rows[:, None] * NT + t[None, :]
            score = tl.load(part_score_ptr + off, mask=m2, other=float("-inf"))
            idx = tl.load(part_idx_ptr + off, mask=m2, other=0)
            zb = tl.load(part_z_ptr + off, mask=m2, other=0.0)
            m = tl.load(part_m_ptr + off, mask=m2, other=float("-inf"))
            s = tl.load(part_s_ptr + off, mask=m2, other=0.0)

            tile_best = tl.max(score, axis=1)
            tile_arg = tl.argmax(score, axis=1)
            pick = t[None, :] == (t0 + tile_arg)[:, None]
            tile_tok = tl.sum(tl.where(pick, idx, 0), axis=1)
            tile_z = tl.sum(tl.where(pick, zb, 0.0), axis=1)
            better = tile_best > run_best  # strict: earlier tiles (lower ids) win ties
            run_best = tl.where(better, tile_best, run_best)
            run_tok = tl.where(better, tile_tok, run_tok)
            run_z = tl.where(better, tile_z, run_z)

            new_m = tl.maximum(run_m, tl.max(m, axis=1))
            run_s = run_s * tl.exp(run_m - new_m) + tl.sum(s * tl.exp(m - new_m[:, None]), axis=1)
            run_m = new_m

        lse = run_m + tl.log(tl.where(rmask, run_s, 1.0))  # padded rows have run_s = 0
        temp = tl.load(temp_ptr + rows, mask=rmask, other=1.0).to(tl.float32)
        prob = tl.where(temp < GREEDY_EPS, 1.0, tl.exp(tl.where(rmask, run_z - lse, 0.0)))
        out = rows * s_out + k
        tl.store(tok_ptr + out, run_tok.to(tl.int64), mask=rmask)
        tl.store(prob_ptr + out, prob, mask=rmask)
        tl.store(lse_ptr + out, lse, mask=rmask)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


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
    block_k: int | None = None,
) -> MarkovSample:
    """Vanilla head on Triton (CUDA, or CPU under TRITON_INTERPRET=1). Same outputs as the reference."""
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
    w1 = markov_w1.contiguous()
    w2 = markov_w2.contiguous()
    temps = temperatures.to(device=device, dtype=torch.float32).contiguous()
    seeds = seeds.to(device=device, dtype=torch.int64).contiguous()
    anchor = anchor_tokens.to(device=device, dtype=torch.int64).contiguous()

    # Tiles: tl.dot needs >= 16 on every side; a request tile as wide as the batch (<= 128) streams W2 once.
    block_r = block_r or min(128, max(16, _next_pow2(R)))
    block_v = block_v or (min(128, 8192 // block_r) if V >= 128 else max(16, _next_pow2(V)))  # cap the tile
    block_k = block_k or min(64, max(16, _next_pow2(rank)))
    num_warps = 8 if block_r * block_v >= 128 * 128 else 4
    nt = triton.cdiv(V, block_v)

    tokens = torch.empty(R, G, dtype=torch.int64, device=device)
    probs = torch.empty(R, G, dtype=torch.float32, device=device)
    lse = torch.empty(R, G, dtype=torch.float32, device=device)
    emb = torch.empty(R, G, rank, dtype=w1.dtype, device=device)
    logits = torch.empty(R, G, V, dtype=torch.float32, device=device) if return_logits else None
    logits_arg = logits if logits is not None else probs  # dummy pointer, never written
    sl = (logits.stride(0), logits.stride(1)) if logits is not None else (0, 0)
    part_score = torch.empty(R, nt, dtype=torch.float32, device=device)
    part_idx = torch.empty(R, nt, dtype=torch.int32, device=device)
    part_z = torch.empty_like(part_score)
    part_m = torch.empty_like(part_score)
    part_s = torch.empty_like(part_score)
    block_t = min(1024, _next_pow2(nt))
    reduce_block_r = 16 if block_t <= 256 else 4

    grid_step = (triton.cdiv(R, block_r), nt)
    grid_reduce = (triton.cdiv(R, reduce_block_r),)
    for k in range(G):
        prev, s_prev = (anchor, 1) if k == 0 else (tokens[:, k - 1], tokens.stride(0))
        _markov_step_kernel[grid_step](
            base_logits, base_logits.stride(0), base_logits.stride(1), base_logits.stride(2),
            w1, w1.stride(0), w2, w2.stride(0),
            prev, s_prev, temps, seeds,
            emb, emb.stride(0), emb.stride(1),
            logits_arg, sl[0], sl[1],
            part_score, part_idx, part_z, part_m, part_s,
            k, R, V, nt,
            RANK=rank, BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_K=block_k,
            WRITE_LOGITS=logits is not None, IEEE_DOT=w1.dtype == torch.float32 or _interpreting(),
            SALT=_rng.SALT_DRAFT_GUMBEL, GREEDY_EPS=GREEDY_EPS,
            num_warps=num_warps,
        )
        _markov_reduce_kernel[grid_reduce](
            part_score, part_idx, part_z, part_m, part_s,
            temps, tokens, probs, lse, tokens.stride(0),
            k, R, nt,
            BLOCK_R=reduce_block_r, BLOCK_T=block_t, GREEDY_EPS=GREEDY_EPS,
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
) -> MarkovSample:
    """Triton for the vanilla head on CUDA, torch otherwise; `.backend` / `.reason` say which and why.

    backend: "auto" | "triton" | "torch". "triton" on CPU tensors needs TRITON_INTERPRET=1 (tests only).
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
                                    return_logits=return_logits)
    if backend == "triton" and head_kind != "vanilla":
        raise ValueError(reason)
    out = markov_sample_reference(base_logits, markov_w1, markov_w2, anchor_tokens, temperatures, seeds,
                                  return_logits=return_logits, head_kind=head_kind, hidden=hidden,
                                  gate_proj=gate_proj, joint_proj=joint_proj)
    out.reason = reason
    return out
