"""A tiny random target + a random DSpark drafter shaped for it (DeepSpec format, without shared tensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_dspark.drafter.checkpoint import save_drafter
from sglang_dspark.drafter.config import DSparkConfig
from sglang_dspark.drafter.model import DSparkDraftModel
from tests.tiny_model import build_tiny_model


def build_tiny_drafter(target_dir: Path, out_dir: Path, block_size: int = 4, markov_rank: int = 16,
                       layers: int = 1, seed: int = 1, dtype: torch.dtype = torch.float32, **overrides) -> Path:
    target_cfg = json.loads((Path(target_dir) / "config.json").read_text())
    cfg = DSparkConfig.for_target(target_cfg, num_layers=layers, block_size=block_size, markov_rank=markov_rank,
                                  mask_token_id=target_cfg["vocab_size"] - 1,
                                  target_layer_ids=list(range(target_cfg["num_hidden_layers"] - 1)), **overrides)
    torch.manual_seed(seed)
    model = DSparkDraftModel(cfg).to(dtype)
    save_drafter(model, out_dir, include_shared=False)
    return Path(out_dir)


def build_tiny_pair(root: Path, dtype: str = "float32", arch: str = "qwen2", layers: int = 4, **drafter_kw):
    target = build_tiny_model(Path(root) / "target", dtype=dtype, arch=arch, layers=layers)
    drafter = build_tiny_drafter(target, Path(root) / "drafter", **drafter_kw)
    return target, drafter


def make_bigram_target(target_dir: Path, logit_scale: float = 1.0) -> Path:
    """Zero every attention and MLP output projection: the target's next-token logits then depend only on the
    current token (lm_head(norm(embed[x]))), so its exact continuation distribution is a bigram chain that a test
    can compute, and a drafter can match it exactly."""
    from safetensors.torch import load_file, save_file

    path = Path(target_dir) / "model.safetensors"
    state = load_file(path)
    for k in list(state):
        if k.endswith("o_proj.weight") or k.endswith("down_proj.weight"):
            state[k] = torch.zeros_like(state[k])
    if logit_scale != 1.0:
        key = "lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight"
        state[key] = state[key] * logit_scale
    save_file(state, path, metadata={"format": "pt"})
    return Path(target_dir)


def bigram_logits(target_dir: Path) -> torch.Tensor:
    """[V, V] next-token logits of a bigram target (row = current token), in float64."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    state = {k: v.double() for k, v in load_file(Path(target_dir) / "model.safetensors").items()}
    emb = state["model.embed_tokens.weight"]
    lm = state.get("lm_head.weight", emb)
    g = state["model.norm.weight"]
    normed = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * g
    return normed @ lm.T


def build_matching_drafter(target_dir: Path, out_dir: Path, block_size: int = 4, noise: float = 0.0,
                           seed: int = 1) -> Path:
    """A drafter for a bigram target whose Markov head reproduces the target's transition logits (noise=0: it
    predicts the target's greedy token every time; noise>0: partial acceptance). Its backbone output is zeroed
    (final norm weight 0), so logits = W2 W1[prev] with W1[x] = norm(embed[x]) and W2 = lm_head."""
    from safetensors.torch import load_file

    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    d, V = cfg["hidden_size"], cfg["vocab_size"]
    dcfg = DSparkConfig.for_target(cfg, num_layers=1, block_size=block_size, markov_rank=d,
                                   mask_token_id=V - 1, target_layer_ids=list(range(cfg["num_hidden_layers"] - 1)))
    torch.manual_seed(seed)
    model = DSparkDraftModel(dcfg)
    state = {k: v.float() for k, v in load_file(Path(target_dir) / "model.safetensors").items()}
    emb = state["model.embed_tokens.weight"]
    lm = state.get("lm_head.weight", emb)
    g = state["model.norm.weight"]
    normed = emb * torch.rsqrt(emb.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]) * g
    with torch.no_grad():
        model.norm.weight.zero_()
        model.markov_head.markov_w1.weight.copy_(normed + noise * torch.randn_like(normed))
        model.markov_head.markov_w2.weight.copy_(lm)
    save_drafter(model, out_dir, include_shared=False)
    return Path(out_dir)
