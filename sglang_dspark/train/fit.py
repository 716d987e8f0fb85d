"""`fit`: train the drafter from a feature cache (reference §4.4-4.6).

One sequence per micro step (DeepSpec's local batch 1); `batch` sequences are accumulated per optimizer step and
every loss is divided by the weight sum of the whole step (global token-weighted mean). AdamW, linear warmup then
cosine to 0, grad clip 1.0. Checkpoints: <out>/step_<N>/{config.json, model.safetensors, training_state.pt} and
<out>/latest (text: the newest step dir). Resume restores weights (fp32), optimizer, scheduler and RNG states;
data order and anchors are pure functions of (seed, micro-step index), so a resumed run replays the same stream.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time

import torch
from tqdm import tqdm

from ..cpu_features import cpu_model_and_flags, has_native_bf16
from ..drafter import DSparkConfig, DSparkDraftModel, block_labels, load_drafter, sample_anchors, save_drafter
from .cache import CacheReader
from .distributed import agree_any, barrier, init_world, local_device, shutdown, sum_gradients, sum_stats
from .losses import (block_positions, candidate_vocab, dspark_losses, loss_weights, target_argmax,
                     target_block_logits)
from .target_stats import target_probs
from .target import load_target_shared_weights, read_target_config

SHARED = ("embed_tokens.weight", "lm_head.weight")


def build_config(args, manifest: dict, target_path: str) -> DSparkConfig:
    return DSparkConfig.for_target(
        read_target_config(target_path), num_layers=args.layers, block_size=args.block_size,
        markov_rank=args.markov_rank, intermediate_size=args.intermediate_size,
        target_layer_ids=manifest["target_layer_ids"], mask_token_id=args.mask_token_id,
        tokenizer_size=manifest.get("tokenizer_size"), markov_head_type=args.markov_head_type,
        enable_confidence_head=not args.no_confidence_head, num_anchors=args.num_anchors)


def lr_lambda_for(total_steps: int, warmup_steps: int):
    def f(step: int) -> float:  # multiplier of the base lr for optimizer step `step` (0-based)
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return f


def use_autocast(mode: str, device_type: str, cpu_flags: list[str] | None = None) -> bool:
    """bf16 autocast pays on CUDA and on CPUs whose bf16 dot products are native; elsewhere the CPU upcasts every
    bf16 GEMM and autocast only adds conversions."""
    if mode != "auto":
        return mode == "bf16"
    if device_type == "cuda":
        return True
    if cpu_flags is None:
        cpu_flags = cpu_model_and_flags()[1]
    return has_native_bf16(cpu_flags)


def latest_checkpoint(out: str) -> str | None:
    p = os.path.join(out, "latest")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return os.path.join(out, f.read().strip())


class DataOrder:
    """Micro-step index -> cache index: deterministic per-epoch shuffle (seed + epoch)."""

    def __init__(self, indices: list[int], seed: int) -> None:
        self.indices, self.seed, self._perm = indices, seed, {}

    def __call__(self, micro: int) -> int:
        epoch, i = divmod(micro, len(self.indices))
        if epoch not in self._perm:
            self._perm = {epoch: torch.randperm(len(self.indices), generator=torch.Generator().manual_seed(
                self.seed + epoch)).tolist()}
        return self.indices[self._perm[epoch][i]]


def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def save_checkpoint(out, step, model, optimizer, scheduler, args) -> str:
    d = os.path.join(out, f"step_{step}")
    save_drafter(model, d, include_shared=not args.no_save_shared,
                 dtype=torch.bfloat16 if args.save_dtype == "bf16" else torch.float32)
    trainable = {k: v.detach().cpu() for k, v in model.state_dict().items() if k not in SHARED}
    torch.save({"step": step, "model": trainable, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "rng": _rng_state(), "args": vars(args)},
               os.path.join(d, "training_state.pt.tmp"))
    os.replace(os.path.join(d, "training_state.pt.tmp"), os.path.join(d, "training_state.pt"))
    with open(os.path.join(out, "latest.tmp"), "w") as f:
        f.write(f"step_{step}\n")
    os.replace(os.path.join(out, "latest.tmp"), os.path.join(out, "latest"))
    steps = sorted(int(n[5:]) for n in os.listdir(out) if n.startswith("step_") and n[5:].isdigit())
    for old in steps[:-args.keep_checkpoints] if args.keep_checkpoints > 0 else []:
        shutil.rmtree(os.path.join(out, f"step_{old}"), ignore_errors=True)
    return d


def _sampled_targets(sample, model, ids, lm, last, anchors, keep, args, gen):
    """Candidate vocabulary and exact target probabilities over it from the cache's target statistics."""
    pos = block_positions(anchors[0], model.block_size, last.shape[1])  # [N, B]
    top = sample["topk_ids"][: args.max_length].to(pos.device)[pos]
    labels = block_labels(ids, lm, anchors, keep, model.block_size)[0]
    vocab = candidate_vocab(None, labels, args.vocab_sample_top_k, args.vocab_sample_negatives, gen, top_ids=top,
                            vocab_size=model.config.vocab_size)
    lse = sample["lse"][: args.max_length].to(pos.device)[pos]
    if not bool(torch.isfinite(lse).all()):
        raise ValueError(f"sample {sample['id']}: a block reads a position without target statistics; rerun "
                         f"`train targets` (it computes the rows fit can read)")
    return vocab, target_probs(last[0][pos], model.lm_head.weight, lse, vocab)[None]


def run_fit(args) -> dict:
    cache = CacheReader(args.cache)
    manifest = cache.manifest
    target_path = args.target or manifest["target"]
    world = init_world(torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu")).type)
    device = local_device(world, args.device)
    train_idx, held_idx = cache.split(args.holdout_fraction)
    if not train_idx:
        raise ValueError(f"{args.cache}: no training samples (holdout_fraction={args.holdout_fraction})")
    os.makedirs(args.out, exist_ok=True)

    if args.init_from and args.init_from_target:
        raise ValueError("--init-from and --init-from-target are two different starting points: pass one")
    resume_dir = None if args.no_resume else latest_checkpoint(args.out)
    init_from = None if resume_dir else args.init_from
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    embed, head = load_target_shared_weights(target_path)
    if init_from:  # the checkpoint loader validates every tensor by name and shape
        model = load_drafter(init_from, embed, head, dtype=torch.float32, draft_vocab=False)
        model.config.num_anchors = args.num_anchors
        config = model.config
        print(f"[fit] initialised from {init_from}")
    else:
        config = DSparkConfig.from_json(resume_dir) if resume_dir else build_config(args, manifest, target_path)
        model = DSparkDraftModel(config)
        if args.init_from_target and not resume_dir:
            from .warm_start import init_from_target

            seqs = [cache.read(i, ("input_ids",))["input_ids"] for i in train_idx[: args.init_channel_samples]]
            info = init_from_target(model, target_path, config.num_target_layers, seqs)
            print(f"[fit] initialised from the target's layers {info['copied_layers']}"
                  + (f", MLP pruned {info['target_intermediate_size']} -> {info['pruned_to']} channels"
                     if info["pruned_to"] else ""))
    with torch.no_grad():
        model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay)
    warmup = max(1, int(round(args.warmup_ratio * args.steps)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda_for(args.steps, warmup))
    start = 0
    if resume_dir:
        st = torch.load(os.path.join(resume_dir, "training_state.pt"), map_location="cpu", weights_only=False)
        model.load_state_dict(st["model"], strict=False)
        optimizer.load_state_dict(st["optimizer"])
        scheduler.load_state_dict(st["scheduler"])
        _set_rng_state(st["rng"])
        start = st["step"]
        print(f"[fit] resumed from {resume_dir} at step {start}")
    n_params = sum(p.numel() for p in params)
    print(f"[fit] {len(train_idx)} train / {len(held_idx)} held-out samples; {n_params / 1e6:.2f}M trainable "
          f"params; device {device}; steps {start}->{args.steps}"
          + (f"; rank {world.rank} of {world.size}" if world.size > 1 else ""))

    use_stats = args.vocab_sample_top_k > 0 and cache.has_targets
    if use_stats:
        stored_k = cache.read(train_idx[0], ("topk_ids",))["topk_ids"].shape[-1]
        if stored_k < args.vocab_sample_top_k:
            raise ValueError(f"{args.cache}: target statistics keep top-{stored_k}, fit wants "
                             f"--vocab-sample-top-k {args.vocab_sample_top_k}; rerun `train targets --top-k`")
    print(f"[fit] target distributions: {'precomputed statistics' if use_stats else 'lm_head every step'}")
    order = DataOrder(train_idx, args.seed)
    B = config.block_size
    amp = use_autocast(args.amp, device.type)
    print(f"[fit] bf16 autocast {'on' if amp else 'off'} (--amp {args.amp})")
    log_path = os.path.join(args.out, "train_log.jsonl")
    history = []
    eval_every = args.eval_every
    held_eval = held_idx[: args.eval_samples]

    def evaluate() -> dict:
        from .heldout import heldout_acceptance

        r = heldout_acceptance(model, cache, held_eval, num_anchors=args.eval_anchors, max_length=args.max_length,
                               seed=args.seed, device=device)
        return {"heldout_tau": r["tau"], "heldout_top1": r["top1"], "heldout_blocks": r["blocks"]}

    blocks = 0
    if start > 0 and os.path.exists(log_path):
        with open(log_path) as f:
            rows = [json.loads(x) for x in f if x.strip()]
        blocks = next((r["blocks"] for r in reversed(rows) if "blocks" in r and r["step"] <= start), 0)
    if eval_every and start == 0 and held_eval and world.main:
        with open(log_path, "a") as f:
            f.write(json.dumps({"step": 0, "blocks": 0, **evaluate()}) + "\n")
    t_start = time.time()  # elapsed_s in the log: this process's fit time, for rates and CPU-hours
    bar = tqdm(range(start, args.steps), desc="fit", initial=start, total=args.steps, unit="step",
               disable=not world.main)
    for step in bar:
        micro = []
        for i in range(args.batch):
            m = step * args.batch + i
            # other ranks' sequences: only what their anchors and loss weights need
            s = cache[order(m)] if world.mine(i) else cache.read(order(m), ("input_ids", "loss_mask"))
            ids = s["input_ids"][: args.max_length].long()[None].to(device)
            lm = s["loss_mask"][: args.max_length][None].to(device)
            anchors, keep = sample_anchors(lm, config.num_anchors,
                                           torch.Generator().manual_seed(args.seed * 1_000_003 + m))
            _, emask = block_labels(ids, lm, anchors, keep, B)
            micro.append((m, s, ids, lm, anchors, keep, loss_weights(emask, args.gamma).sum()))
            blocks += int(keep.sum())
        denom = torch.stack([w for *_, w in micro]).sum().clamp_min(1e-6)
        optimizer.zero_grad(set_to_none=True)
        agg: dict[str, float] = {}
        for i, (m, s, ids, lm, anchors, keep, _) in enumerate(micro):
            if not world.mine(i):
                continue
            hidden = s["hidden"][: args.max_length][None].to(device, torch.float32)
            last = s["last_hidden"][: args.max_length][None].to(device, torch.float32)
            gen = torch.Generator().manual_seed(args.seed * 7_919 + m)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                tlogits = tprobs = vocab = None
                if use_stats:
                    vocab, tprobs = _sampled_targets(s, model, ids, lm, last, anchors, keep, args, gen)
                else:
                    tlogits = target_block_logits(model.lm_head, last, anchors, B)
                    if args.vocab_sample_top_k > 0:
                        vocab = candidate_vocab(tlogits, block_labels(ids, lm, anchors, keep, B)[0],
                                                args.vocab_sample_top_k, args.vocab_sample_negatives, gen)
                logits, conf, labels, emask = model.forward_train(ids, hidden, lm, anchors, keep, vocab)
                if args.ce_labels == "target":
                    labels = target_argmax(s, tlogits, anchors, B, ids.shape[1], args.max_length)
            loss, stats = dspark_losses(logits, tlogits, conf, labels, emask, args.ce_weight, args.l1_weight,
                                        args.conf_weight if config.enable_confidence_head else 0.0, args.gamma,
                                        denom=denom, vocab=vocab, target_probs=tprobs)
            loss.backward()
            share = stats["weight"] / float(denom)
            for k, v in stats.items():
                agg[k] = agg.get(k, 0.0) + (v if k in ("ce", "l1", "conf", "weight") else v * share)
            agg["loss"] = agg.get("loss", 0.0) + loss.item()
        sum_gradients(params, world)
        agg = sum_stats(agg, world, device)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        optimizer.step()
        scheduler.step()
        rec = {"step": step + 1, "blocks": blocks, "lr": scheduler.get_last_lr()[0], "grad_norm": float(grad_norm),
               "elapsed_s": round(time.time() - t_start, 3), **agg}
        evaluated = bool(eval_every and held_eval and world.main
                         and ((step + 1) % eval_every == 0 or step + 1 == args.steps))
        if evaluated:
            rec.update(evaluate())
        history.append(rec)
        bar.set_postfix(loss=f"{agg['loss']:.4f}", acc=f"{agg.get('accept_soft', 0):.3f}",
                        **({"tau": f"{rec['heldout_tau']:.3f}"} if evaluated else {}))
        if world.main and ((step + 1) % args.log_every == 0 or step + 1 == args.steps or evaluated):
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        final_step = step + 1
        out_of_time = bool(args.max_minutes) and agree_any(time.time() - t_start > args.max_minutes * 60, world)
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps or out_of_time:
            if world.main:
                save_checkpoint(args.out, step + 1, model, optimizer, scheduler, args)
            barrier(world)
        if out_of_time:
            print(f"[fit] --max-minutes {args.max_minutes} reached at step {step + 1} of {args.steps}")
            break
    shutdown(world)
    return {"history": history, "out": args.out, "final_step": final_step}
