"""Load our drafter next to a running SGLang target, checking that the two fit together."""

from __future__ import annotations

import logging
import os

import torch

from sglang_dspark.drafter.checkpoint import load_drafter
from sglang_dspark.drafter.config import DSparkConfig
from sglang_dspark.drafter.sts import StsParams, load_sts_params
from sglang_dspark.sglang_plugin import cpu_gemm


logger = logging.getLogger(__name__)


class DrafterMismatchError(ValueError):
    pass


def check_drafter_fits(cfg: DSparkConfig, hidden_size: int, vocab_size: int, num_layers: int) -> None:
    problems = []
    if cfg.hidden_size != hidden_size:
        problems.append(f"hidden_size {cfg.hidden_size} != target hidden_size {hidden_size}")
    if cfg.vocab_size != vocab_size:
        problems.append(f"vocab_size {cfg.vocab_size} != target vocab_size {vocab_size}")
    if cfg.num_target_layers != num_layers:
        problems.append(f"num_target_layers {cfg.num_target_layers} != target num_hidden_layers {num_layers}")
    bad_ids = [i for i in cfg.target_layer_ids if not 0 <= i < num_layers - 1]
    if bad_ids:
        problems.append(f"target_layer_ids {bad_ids} not capturable (must be in [0, {num_layers - 2}])")
    if problems:
        raise DrafterMismatchError("DSPARK_EXT drafter does not fit the target: " + "; ".join(problems))


def _weight(module) -> torch.Tensor | None:
    w = getattr(module, "weight", None)
    return None if w is None else w.detach()


def _full_vocab(weight: torch.Tensor | None, vocab_size: int) -> torch.Tensor | None:
    """Under tensor parallelism the target's embedding and lm_head hold one vocabulary shard per rank (padded):
    gather the shards in rank order so the drafter sees every token; the caller trims the padding."""
    if weight is None or weight.shape[0] >= vocab_size:
        return weight
    from sglang.srt.distributed.communication_op import tensor_model_parallel_all_gather
    from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size

    if get_tensor_model_parallel_world_size() <= 1:
        return weight
    full = tensor_model_parallel_all_gather(weight.contiguous(), dim=0)
    if full.shape[0] < vocab_size:
        raise DrafterMismatchError(f"gathered target vocabulary has {full.shape[0]} rows, the drafter needs "
                                   f"{vocab_size}")
    return full


def load_drafter_for_target(path: str, target_model, model_config, options, device):
    if not path or not os.path.isdir(path):
        raise DrafterMismatchError(f"DSPARK_EXT needs --speculative-draft-model-path DIR; got {path!r}")
    cfg = DSparkConfig.from_json(os.path.join(path, "config.json"))
    hf = model_config.hf_config
    check_drafter_fits(cfg, hf.hidden_size, hf.vocab_size, hf.num_hidden_layers)
    dtype = getattr(torch, options.draft_dtype) if options.draft_dtype else model_config.dtype
    gemm_kind = cpu_gemm.engine_gemm_kind()
    if not options.draft_dtype and gemm_kind == cpu_gemm.ROW_DISPATCH:
        dtype = torch.float32  # torch's bf16 GEMM costs per row: the drafter's gamma-row GEMMs go fp32
    inner = getattr(target_model, "model", target_model)
    embed = _full_vocab(_weight(getattr(inner, "embed_tokens", None)), cfg.vocab_size)
    lm_head = _full_vocab(_weight(getattr(target_model, "lm_head", None)), cfg.vocab_size)
    if lm_head is None or lm_head.shape[0] < cfg.vocab_size:
        lm_head = embed  # tied embeddings
    if embed is not None:
        embed = embed[: cfg.vocab_size]
    if lm_head is not None:
        lm_head = lm_head[: cfg.vocab_size]
    drafter = load_drafter(path, target_embed=embed, target_lm_head=lm_head, dtype=dtype, device=device,
                           draft_vocab=not options.full_draft_vocab)
    # a bf16 drafter on the small-M kernel too (AVX2 or AVX512-BF16): a draft pass is R x gamma rows, its range
    if not options.draft_dtype and gemm_kind in (cpu_gemm.KERNEL_DISPATCH, *cpu_gemm.NATIVE_KINDS):
        logger.info("dspark drafter gemm: %s", cpu_gemm.route_drafter(drafter))
    if options.sts_path:
        sts = load_sts_params(options.sts_path)
    else:  # the drafter's own sts.json, or None everywhere when it has none
        sts = StsParams(drafter.sts_temperatures, drafter.sts_temperatures_sampled, drafter.sts_biases,
                        drafter.sts_biases_sampled)
    return drafter, sts

