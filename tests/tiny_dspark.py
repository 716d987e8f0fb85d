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
