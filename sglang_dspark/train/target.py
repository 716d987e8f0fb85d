"""The HF target as a feature source: raw outputs of the drafter's target layers (forward hooks, reference §1.3:
-1 = embedding output, l >= 0 = output of decoder layer l) plus the final-normed last hidden state."""

from __future__ import annotations

import glob
import json
import os

import torch


def read_target_config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("text_config", cfg) if "hidden_size" not in cfg else cfg


def load_target_shared_weights(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens [V, d], lm_head [V, d]) read straight from the target's safetensors, without building it."""
    from safetensors import safe_open

    embed = head = None
    for fn in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(fn, framework="pt") as f:
            for k in f.keys():
                if k.endswith("embed_tokens.weight") and "visual" not in k and embed is None:
                    embed = f.get_tensor(k)
                elif k.endswith("lm_head.weight") and head is None:
                    head = f.get_tensor(k)
    if embed is None:
        raise FileNotFoundError(f"{path}: no '*embed_tokens.weight' tensor in *.safetensors")
    return embed, embed if head is None else head  # tied targets store only the embedding


class HFTarget:
    """Wraps AutoModelForCausalLM; forward() returns (last_hidden [b, T, d], features [b, T, m*d])."""

    def __init__(self, path: str, target_layer_ids: list[int], dtype: torch.dtype = torch.bfloat16,
                 device: str | torch.device = "cpu", model=None) -> None:
        if model is None:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        self.model = model.to(device).eval()
        self.decoder = self.model.get_decoder()
        self.layer_ids = list(target_layer_ids)
        self._captured: dict[int, torch.Tensor] = {}
        for lid in self.layer_ids:
            module = self.decoder.embed_tokens if lid == -1 else self.decoder.layers[lid]
            module.register_forward_hook(self._hook(lid))

    def _hook(self, lid: int):
        def hook(_module, _inputs, output):
            self._captured[lid] = output[0] if isinstance(output, tuple) else output
        return hook

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None,
                past_key_values=None, attention_mask: torch.Tensor | None = None):
        self._captured.clear()
        out = self.decoder(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                           past_key_values=past_key_values, use_cache=past_key_values is not None)
        feats = torch.cat([self._captured[lid] for lid in self.layer_ids], dim=-1)
        return out.last_hidden_state, feats

    @torch.no_grad()
    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(last_hidden).float()

    def stop_token_ids(self, tokenizer=None) -> list[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None and tokenizer is not None:
            eos = tokenizer.eos_token_id
        if eos is None:
            return []
        return [eos] if isinstance(eos, int) else list(eos)


def crop_cache(cache, new_length: int) -> None:
    """Keep the first `new_length` positions of an HF DynamicCache (transformers>=5.19: crop(-n) removes n)."""
    extra = cache.get_seq_length() - new_length
    if extra > 0:
        cache.crop(-extra)
