"""DSpark draft model (reference §1): a few Qwen3-shaped layers whose attention sees the target's projected
hidden states as extra K/V ("KV injection"), one parallel pass over [anchor, MASK, ...], then a low-rank Markov head
that corrects the logits left to right and a confidence head that predicts per-position acceptance.

Two entry points share every piece of math:
  * serving:  project_context -> context_kv (cached by the caller) -> backbone / propose
  * training: forward_train (many anchors per sequence, one dense boolean mask, torch SDPA)
Tensor names equal DeepSpec's flat safetensors names (reference §2.3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..sampling import sample_rows
from .config import DSparkConfig

GREEDY_TEMPERATURE = 1e-5  # temperatures below this mean argmax (reference §1.6)


# ---------------------------------------------------------------------------------------------------- building blocks
class RMSNorm(nn.Module):
    """Qwen3 RMSNorm: normalise in fp32, no +1 offset."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """Default (unscaled) RoPE tables for integer `positions` [...] -> cos, sin [..., head_dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.to(torch.float32)[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, heads, hd]; cos/sin [..., T, hd] (rotate-half convention of HF Llama/Qwen)."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftAttention(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        d, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(d, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None

    def key_value(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """K (normed, rotated) and V of inputs x [..., T, d] -> [..., T, Hkv, hd] each.
        Used for injected context (x = projected target features) and for block tokens alike."""
        shape = (*x.shape[:-1], self.num_kv_heads, self.head_dim)
        k = self.k_proj(x).view(shape)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return apply_rope(k, cos, sin), self.v_proj(x).view(shape)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        """x [R, Q, d] block tokens; ctx_k/v [R, C, Hkv, hd]; mask bool [R, Q, C+Q] (True = may attend)."""
        R, Q, _ = x.shape
        q = self.q_proj(x).view(R, Q, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = apply_rope(q, cos, sin)
        k_blk, v_blk = self.key_value(x, cos, sin)
        k = torch.cat([ctx_k.to(k_blk.dtype), k_blk], dim=1)
        v = torch.cat([ctx_v.to(v_blk.dtype), v_blk], dim=1)
        rep = self.num_heads // self.num_kv_heads
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(R, Q, self.num_heads * self.head_dim))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, h, cos, sin, ctx_k, ctx_v, mask):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class MarkovHead(nn.Module):
    """Low-rank first-order correction of the block logits (reference §1.6)."""

    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        r, V, d = cfg.markov_rank, cfg.vocab_size, cfg.hidden_size
        self.head_type = cfg.markov_head_type
        self.rank = r
        self.markov_w1 = nn.Embedding(V, r)
        self.markov_w2 = nn.Linear(r, V, bias=False)
        self.w2_linear = F.linear  # serving may route the correction GEMM to another implementation (cpu_gemm.py)
        if self.head_type == "gated":
            self.gate_proj = nn.Linear(d + r, r, bias=True)
        if self.head_type == "rnn":
            self.joint_proj = nn.Linear(2 * r + d, 3 * r, bias=True)

    def step(self, h: torch.Tensor, prev: torch.Tensor, state: torch.Tensor | None = None,
             vocab: torch.Tensor | None = None, w2_rows: torch.Tensor | None = None):
        """One position: h [..., d] (final-normed), prev [...] token ids, rnn state [..., r] or None (= zeros).
        Returns (logit correction [..., V] (or [..., len(vocab)] for a vocabulary subset), new state or None).
        w2_rows: markov_w2 rows already gathered for a fixed subset (the serving draft vocabulary)."""
        e = self.markov_w1(prev).to(h.dtype)
        if self.head_type == "vanilla":
            z = e
        elif self.head_type == "gated":
            z = torch.sigmoid(self.gate_proj(torch.cat([h, e], dim=-1))) * e
        else:  # rnn
            if state is None:
                state = torch.zeros_like(e)
            a_g, a_c, a_o = self.joint_proj(torch.cat([state, e, h], dim=-1)).chunk(3, dim=-1)
            g = torch.sigmoid(a_g)
            state = g * state + (1 - g) * torch.tanh(a_c)
            z = torch.tanh(a_o)
        if w2_rows is None:
            w2_rows = self.markov_w2.weight if vocab is None else self.markov_w2.weight[vocab]
        return self.w2_linear(z, w2_rows), state

    def teacher_forced(self, h: torch.Tensor, prev: torch.Tensor, vocab: torch.Tensor | None = None) -> torch.Tensor:
        """Whole blocks at once: h [..., B, d], prev [..., B] -> correction [..., B, V] (or [..., B, len(vocab)])."""
        if self.head_type != "rnn":
            return self.step(h, prev, vocab=vocab)[0]
        state, outs = None, []
        for k in range(h.shape[-2]):
            corr, state = self.step(h[..., k, :], prev[..., k], state, vocab=vocab)
            outs.append(corr)
        return torch.stack(outs, dim=-2)


class ConfidenceHead(nn.Module):
    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, 1, bias=True)

    def forward(self, h: torch.Tensor, markov_emb: torch.Tensor | None) -> torch.Tensor:
        x = h if markov_emb is None else torch.cat([h, markov_emb.to(h.dtype)], dim=-1)
        return self.proj(x).squeeze(-1)


# ---------------------------------------------------------------------------------------------------- the model
@dataclass
class Proposal:
    tokens: torch.Tensor  # [R, B] long: draft tokens d_1..d_B
    logits: torch.Tensor  # [R, B, V] fp32: Markov-corrected logits, before temperature (the draft distribution q);
    #                       [R, B, len(vocab)] over `vocab` when the drafter runs a reduced draft vocabulary
    conf_logits: torch.Tensor  # [R, B] fp32: raw confidence logits (zeros without a confidence head)
    vocab: torch.Tensor | None = None  # sorted token ids the columns of `logits` stand for (None: all V)

    def dense_logits(self, vocab_size: int) -> torch.Tensor:
        """[R, B, vocab_size] logits, -inf outside the draft vocabulary (q is exactly 0 there)."""
        if self.vocab is None:
            return self.logits
        out = torch.full((*self.logits.shape[:2], vocab_size), float("-inf"), dtype=self.logits.dtype,
                         device=self.logits.device)
        out[..., self.vocab] = self.logits
        return out


class DSparkDraftModel(nn.Module):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        c = self.config = config
        d = c.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, d)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.fc = nn.Linear(c.num_target_features * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps)
        self.lm_head = nn.Linear(d, c.vocab_size, bias=False)
        self.markov_head = MarkovHead(c) if c.markov_rank > 0 else None
        self.confidence_head = ConfidenceHead(c.confidence_in_features) if c.enable_confidence_head else None
        self.sts_temperatures: list[float] | None = None  # set by load_drafter when sts.json is present
        self.sts_temperatures_sampled: list[float] | None = None  # for requests at T > 0 (sts.py: two regimes)
        self.sts_biases: list[float] | None = None  # sts.py: optional affine extension, None = temperature only
        self.sts_biases_sampled: list[float] | None = None
        self.draft_vocab: torch.Tensor | None = None  # reduced serving vocabulary (set_draft_vocab)
        self._draft_lm_head: torch.Tensor | None = None
        self._draft_w2: torch.Tensor | None = None
        self.draft_lm_head_linear = F.linear  # serving may route the reduced lm_head to another GEMM (cpu_gemm.py)
        self.init_weights()

    def init_weights(self, std: float = 0.02) -> None:
        """HF-style init: Linear/Embedding ~ N(0, std), biases 0, norm weights 1. Shared tensors are then frozen
        (they are overwritten with the target's embed_tokens / lm_head before training)."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, RMSNorm):
                nn.init.ones_(m.weight)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)

    @property
    def _dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # ------------------------------------------------------------------ serving API
    def set_draft_vocab(self, ids: torch.Tensor | None) -> None:
        """Propose only from the sorted token ids `ids` (drafter/draft_vocab.py); None restores all V.
        The lm_head / markov_w2 rows are gathered once here, not per step. Call after moving the model."""
        if ids is None:
            self.draft_vocab = self._draft_lm_head = self._draft_w2 = None
            return
        dev = self.lm_head.weight.device
        self.draft_vocab = ids.to(device=dev, dtype=torch.long)
        self._draft_lm_head = self.lm_head.weight[self.draft_vocab].contiguous()
        self._draft_w2 = (None if self.markov_head is None
                          else self.markov_head.markov_w2.weight[self.draft_vocab].contiguous())

    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Concatenated target features [..., m*d] -> injected context [..., d] (fc then hidden_norm)."""
        return self.hidden_norm(self.fc(target_hidden.to(self._dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor):
        """Per-layer K (k_proj, k_norm, RoPE at `positions`) and V of context ctx [..., N, d].
        Returns k, v [L, ..., N, Hkv, hd]; the caller caches them and never recomputes old positions."""
        cos, sin = self._rope(positions, ctx.dtype)
        kvs = [layer.self_attn.key_value(ctx, cos, sin) for layer in self.layers]
        return torch.stack([k for k, _ in kvs]), torch.stack([v for _, v in kvs])

    def _run_layers(self, block_ids, block_pos, ctx_k, ctx_v, mask):
        h = self.embed_tokens(block_ids).to(self._dtype)
        cos, sin = self._rope(block_pos, h.dtype)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, ctx_k[i], ctx_v[i], mask)
        return self.norm(h)

    def backbone(self, block_ids, block_pos, ctx_k, ctx_v, ctx_valid) -> torch.Tensor:
        """block_ids/block_pos [R, B]; ctx_k/v [L, R, C, Hkv, hd]; ctx_valid bool [R, C] -> h [R, B, d] final-normed.
        The block attends bidirectionally to itself and to every valid context entry (no causal mask)."""
        R, B = block_ids.shape
        mask = torch.cat([ctx_valid[:, None, :].expand(R, B, ctx_valid.shape[1]),
                          torch.ones(R, B, B, dtype=torch.bool, device=ctx_valid.device)], dim=-1)
        return self._run_layers(block_ids, block_pos, ctx_k, ctx_v, mask)

    def block_inputs(self, anchor: torch.Tensor, anchor_pos: torch.Tensor):
        """[anchor, MASK, ..., MASK] ids and positions anchor_pos .. anchor_pos+B-1, for any leading shape."""
        B = self.block_size
        ids = torch.full((*anchor.shape, B), self.config.mask_token_id, dtype=torch.long, device=anchor.device)
        ids[..., 0] = anchor
        pos = anchor_pos[..., None].long() + torch.arange(B, device=anchor.device)
        return ids, pos

    def confidence_logits(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """h [..., d], prev [...] -> raw confidence logits [...] (zeros when the model has no confidence head)."""
        if self.confidence_head is None:
            return torch.zeros(h.shape[:-1], dtype=torch.float32, device=h.device)
        emb = self.markov_head.markov_w1(prev) if self.config.confidence_uses_markov else None
        return self.confidence_head(h, emb).float()

    @torch.no_grad()
    def propose(self, anchor, anchor_pos, ctx_k, ctx_v, ctx_valid, temperature, generator=None,
                sampler: str = "auto", all_greedy: bool | None = None) -> Proposal:
        """One draft round for R requests: anchor/anchor_pos [R], temperature [R] (0 => greedy).
        Markov-corrected tokens are sampled left to right, each fed back as the next `prev` (reference §1.6).
        sampler: "auto" = the Triton Markov sampler (dspark_kernels/) for a vanilla head on CUDA, this torch loop
        otherwise; "triton" / "torch" force one (tests).
        all_greedy: the caller's host-side knowledge that every temperature is 0 (it must be true); None reads
        it from `temperature`, one device sync on a GPU."""
        block_ids, block_pos = self.block_inputs(anchor, anchor_pos)
        h = self.backbone(block_ids, block_pos, ctx_k, ctx_v, ctx_valid)
        vocab = self.draft_vocab
        base = (self.lm_head(h) if vocab is None else self.draft_lm_head_linear(h, self._draft_lm_head)).float()
        R, B, V = base.shape
        temperature = temperature.to(device=h.device, dtype=torch.float32)
        greedy = temperature < GREEDY_TEMPERATURE
        if all_greedy is None:
            all_greedy = bool(greedy.all())
        if vocab is None and self._kernel_sampler(h, sampler):  # the kernel feeds column ids back as tokens
            return self._propose_with_kernel(h, base, anchor.long(), temperature, generator, all_greedy)
        tokens = torch.empty(R, B, dtype=torch.long, device=h.device)
        logits = torch.empty(R, B, V, dtype=torch.float32, device=h.device)
        conf = torch.empty(R, B, dtype=torch.float32, device=h.device)
        prev, state = anchor.long(), None
        for k in range(B):
            lk = base[:, k]
            if self.markov_head is not None:
                corr, state = self.markov_head.step(h[:, k], prev, state, w2_rows=self._draft_w2)
                lk = lk + corr.float()
            conf[:, k] = self.confidence_logits(h[:, k], prev)
            col = lk.argmax(-1)
            if not all_greedy:
                probs = torch.softmax(lk / temperature.clamp_min(GREEDY_TEMPERATURE)[:, None], dim=-1)
                sampled = sample_rows(probs, generator)  # torch.multinomial: ~8x slower on a CPU
                col = torch.where(greedy, col, sampled)
            tok = col if vocab is None else vocab[col]
            logits[:, k], tokens[:, k], prev = lk, tok, tok
        return Proposal(tokens=tokens, logits=logits, conf_logits=conf, vocab=vocab)

    def _kernel_sampler(self, h: torch.Tensor, sampler: str) -> bool:
        if sampler == "torch" or self.markov_head is None or self.markov_head.head_type != "vanilla":
            return False
        if sampler == "triton":
            return True
        try:
            from dspark_kernels._rng import HAS_TRITON
        except ImportError:
            return False
        return HAS_TRITON and h.is_cuda

    def _propose_with_kernel(self, h, base, anchor, temperature, generator, all_greedy: bool) -> Proposal:
        from dspark_kernels import markov_sample

        R = base.shape[0]
        seeds = torch.randint(0, 2**62, (R,), generator=generator, device=generator.device if generator else "cpu")
        w1, w2 = self.markov_head.markov_w1.weight, self.markov_head.markov_w2.weight
        out = markov_sample(base, w1, w2, anchor, temperature, seeds.to(h.device), return_logits=True,
                            backend="triton", all_greedy=all_greedy)
        prev = torch.cat([anchor[:, None], out.tokens[:, :-1]], dim=1)
        return Proposal(tokens=out.tokens, logits=out.logits, conf_logits=self.confidence_logits(h, prev))

    @torch.no_grad()
    def propose_from_hidden(self, anchor, anchor_pos, target_hidden, ctx_positions, ctx_valid, temperature,
                            generator=None) -> Proposal:
        """Convenience without a K/V cache: target_hidden [R, C, m*d] at ctx_positions [R, C]."""
        k, v = self.context_kv(self.project_context(target_hidden), ctx_positions)
        return self.propose(anchor, anchor_pos, k, v, ctx_valid, temperature, generator)

    # ------------------------------------------------------------------ training
    def forward_train(self, input_ids, target_hidden, loss_mask, anchors, keep, vocab: torch.Tensor | None = None):
        """Teacher-forced blocks at N anchors per sequence (reference §4.4).

        `vocab` (sorted token ids) restricts the logits to those columns: training-time sampled vocabulary (the
        frozen lm_head is 152k rows; its matmul and softmax dominate a CPU training step).

        input_ids [b, S], target_hidden [b, S, m*d], loss_mask [b, S], anchors/keep [b, N] (see sample_anchors).
        Returns draft_logits [b, N, B, V] fp32 (Markov-corrected), conf_logits [b, N, B] fp32,
        labels [b, N, B] (token at anchor+k+1), eval_mask [b, N, B] bool (contiguous valid prefix).
        """
        b, S = input_ids.shape
        N, B = anchors.shape[1], self.block_size
        dev = input_ids.device
        input_ids, anchors, keep = input_ids.long(), anchors.long(), keep.bool()
        ctx = self.project_context(target_hidden)
        ctx_k, ctx_v = self.context_kv(ctx, torch.arange(S, device=dev).expand(b, S))

        anchor_ids = input_ids.gather(1, anchors)
        block_ids, block_pos = self.block_inputs(torch.where(keep, anchor_ids, self.config.mask_token_id), anchors)
        # Block j sees context positions < anchor_j and its own B slots. Dummy blocks see only themselves, which
        # keeps every softmax row non-empty (no NaN) while their outputs are masked out of the loss.
        ctx_ok = (torch.arange(S, device=dev) < anchors[..., None]) & keep[..., None]  # [b, N, S]
        ctx_ok = ctx_ok[:, :, None, :].expand(b, N, B, S).reshape(b, N * B, S)
        blk = torch.arange(N, device=dev).repeat_interleave(B)
        blk_ok = (blk[:, None] == blk[None, :]).expand(b, N * B, N * B)
        mask = torch.cat([ctx_ok, blk_ok], dim=-1)
        h = self._run_layers(block_ids.view(b, N * B), block_pos.view(b, N * B), ctx_k, ctx_v, mask)
        h = h.view(b, N, B, -1)

        labels, eval_mask = block_labels(input_ids, loss_mask, anchors, keep, B)
        prev = torch.cat([anchor_ids[..., None], labels[..., :-1]], dim=-1)  # teacher forcing
        head = self.lm_head.weight if vocab is None else self.lm_head.weight[vocab]
        logits = F.linear(h, head).float()
        if self.markov_head is not None:
            logits = logits + self.markov_head.teacher_forced(h, prev, vocab).float()
        return logits, self.confidence_logits(h, prev), labels, eval_mask


def block_labels(input_ids, loss_mask, anchors, keep, block_size: int):
    """labels[b, j, k] = input_ids[anchor_j + k + 1] (index clamped); eval_mask = label inside the sequence, a loss
    token, anchor kept, then cumulative product over k so only a contiguous valid prefix is supervised."""
    b, S = input_ids.shape
    N = anchors.shape[1]
    label_pos = anchors[..., None].long() + torch.arange(1, block_size + 1, device=anchors.device)
    idx = label_pos.clamp(max=S - 1).view(b, N * block_size)
    labels = input_ids.long().gather(1, idx).view(b, N, block_size)
    valid = (label_pos < S) & loss_mask.gather(1, idx).view(b, N, block_size).bool() & keep.bool()[..., None]
    return labels, valid.long().cumprod(dim=-1).bool()


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None):
    """Anchor positions for training (reference §4.4): candidates i in [0, S-2] with loss_mask[i] and
    loss_mask[i+1]; a uniform subset of min(#cand, N) without replacement, sorted, padded with dummies.
    loss_mask [b, S] -> anchors [b, N] long, keep [b, N] bool (False = padding dummy at position 0)."""
    b, S = loss_mask.shape
    lm = loss_mask.bool().cpu()
    anchors = torch.zeros(b, num_anchors, dtype=torch.long)
    keep = torch.zeros(b, num_anchors, dtype=torch.bool)
    for row in range(b):
        cand = torch.nonzero(lm[row, :-1] & lm[row, 1:]).flatten() if S > 1 else torch.zeros(0, dtype=torch.long)
        n = min(len(cand), num_anchors)
        pick = cand[torch.randperm(len(cand), generator=generator)[:n]].sort().values
        anchors[row, :n], keep[row, :n] = pick, True
    return anchors.to(loss_mask.device), keep.to(loss_mask.device)
