"""Load / save drafters in the DeepSpec layout: <dir>/config.json + model.safetensors (flat names, §2.3),
optionally sts.json (our STS temperatures) and draft_vocab.safetensors (our reduced serving vocabulary). embed_tokens / lm_head may be omitted from the file and supplied from
the target instead (they are frozen copies of the target's tensors)."""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import DSparkConfig
from .draft_vocab import DRAFT_VOCAB_NAME, load_draft_vocab
from .model import DSparkDraftModel
from .sts import load_sts_params

SHARED_KEYS = ("embed_tokens.weight", "lm_head.weight")
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
STS_NAME = "sts.json"


class DrafterCheckpointError(ValueError):
    """The safetensors content does not match the config (missing / unexpected / mis-shaped tensor)."""


def _read_tensors(path: str) -> dict[str, torch.Tensor]:
    files = [os.path.join(path, WEIGHTS_NAME)]
    index = os.path.join(path, INDEX_NAME)
    if not os.path.exists(files[0]) and os.path.exists(index):
        with open(index) as f:
            files = [os.path.join(path, n) for n in sorted(set(json.load(f)["weight_map"].values()))]
    if not os.path.exists(files[0]):
        raise DrafterCheckpointError(f"{path}: no {WEIGHTS_NAME} (or {INDEX_NAME})")
    tensors: dict[str, torch.Tensor] = {}
    for fn in files:
        with safe_open(fn, framework="pt") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
    return tensors


def load_drafter(path: str | os.PathLike, target_embed: torch.Tensor | None = None,
                 target_lm_head: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu", draft_vocab: bool = True) -> DSparkDraftModel:
    """Build a DSparkDraftModel from a checkpoint directory, strictly.

    draft_vocab: apply draft_vocab.safetensors when the directory has one (False: propose over all V).
    Shared tensors: the checkpoint's copy wins when present, else `target_embed` / `target_lm_head` ([V, d]).
    Raises DrafterConfigError for a bad config.json and DrafterCheckpointError naming the offending tensor.
    """
    path = os.fspath(path)
    config = DSparkConfig.from_json(os.path.join(path, "config.json"))
    tensors = _read_tensors(path)
    for key, fallback in zip(SHARED_KEYS, (target_embed, target_lm_head)):
        if key not in tensors:
            if fallback is None:
                raise DrafterCheckpointError(
                    f"tensor '{key}' is absent from the checkpoint and no target tensor was given for it")
            tensors[key] = fallback

    with torch.device("meta"):
        model = DSparkDraftModel(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = [k for k in expected if k not in tensors]
    unexpected = [k for k in tensors if k not in expected]
    if missing:
        raise DrafterCheckpointError(f"missing tensor '{missing[0]}' (expected shape {list(expected[missing[0]])})"
                                     + (f" and {len(missing) - 1} more: {missing[1:6]}" if len(missing) > 1 else ""))
    if unexpected:
        raise DrafterCheckpointError(f"unexpected tensor '{unexpected[0]}' (shape {list(tensors[unexpected[0]].shape)})"
                                     f" not in the model built from config.json" +
                                     (f"; also {unexpected[1:6]}" if len(unexpected) > 1 else ""))
    for k, shape in expected.items():
        if tuple(tensors[k].shape) != shape:
            raise DrafterCheckpointError(f"tensor '{k}': expected shape {list(shape)}, found {list(tensors[k].shape)}")

    state = {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
    model.load_state_dict(state, assign=True, strict=True)
    model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    model.eval()

    sts_path = os.path.join(path, STS_NAME)
    if os.path.exists(sts_path):
        sts = load_sts_params(sts_path)
        if len(sts.temperatures) != config.block_size:
            raise DrafterCheckpointError(f"{sts_path}: {len(sts.temperatures)} temperatures for block_size "
                                         f"{config.block_size}")
        model.sts_temperatures, model.sts_temperatures_sampled, model.sts_biases, model.sts_biases_sampled = sts
    vocab_path = os.path.join(path, DRAFT_VOCAB_NAME)
    if draft_vocab and os.path.exists(vocab_path):
        model.set_draft_vocab(load_draft_vocab(vocab_path, config.vocab_size))
    return model


def save_drafter(model: DSparkDraftModel, path: str | os.PathLike, include_shared: bool = False,
                 dtype: torch.dtype | None = None) -> None:
    """Write config.json + model.safetensors (DeepSpec names). include_shared=True also stores
    embed_tokens / lm_head (DeepSpec's own layout, loadable without the target)."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    model.config.to_json(os.path.join(path, "config.json"))
    state = {}
    for k, v in model.state_dict().items():
        if k in SHARED_KEYS and not include_shared:
            continue
        v = v.detach()
        if dtype is not None:
            v = v.to(dtype)
        state[k] = v.cpu().contiguous().clone()  # clone: safetensors refuses tensors that share storage
    tmp = os.path.join(path, WEIGHTS_NAME + ".tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(path, WEIGHTS_NAME))
