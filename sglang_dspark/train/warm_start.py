"""Warm start: the initial drafter is the target's own upper layers (`train fit --init-from-target`).

With L_d draft layers over an L_t-layer target, draft layer i starts as target layer L_t - L_d + i, the final norm
as the target's, and the context projection reads the layer just below the copied ones: `fc` is the identity on
that feature's slice (zero on the others) and `hidden_norm` is the first copied layer's input norm. Draft layer 0's
context K/V are then exactly what the target's layer L_t - L_d computes from that position. The Markov W2 and the
confidence head start at zero, so training begins from the copied layers' own predictions.

A drafter narrower than the target (`--intermediate-size` below the target's, to keep the file small) keeps the
MLP channels with the largest mean |activation| x |down_proj column| measured on a few training sequences.
"""

from __future__ import annotations

import glob
import os

import torch

from ..drafter import DSparkDraftModel

ATTN = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
        "o_proj.weight", "q_norm.weight", "k_norm.weight")
MLP = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")


class WarmStartError(ValueError):
    """The drafter's shape or feature layers do not allow copying the target's upper layers."""


def copied_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    return list(range(num_target_layers - num_draft_layers, num_target_layers))


def required_feature_layer(num_target_layers: int, num_draft_layers: int) -> int:
    return num_target_layers - num_draft_layers - 1


def read_target_tensors(path: str, wanted: list[str]) -> dict[str, torch.Tensor]:
    """Target tensors by name suffix (`layers.22.mlp.up_proj.weight`, `norm.weight`), whatever the prefix."""
    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for fn in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(fn, framework="pt") as f:
            for key in f.keys():
                if "visual" in key or "vision" in key:
                    continue
                for w in wanted:  # a "." before the suffix: layers.1 never matches layers.11, norm never q_norm
                    if w not in out and (key == w or key.endswith("." + w)):
                        out[w] = f.get_tensor(key)
    return out


def check_compatible(model: DSparkDraftModel, num_target_layers: int) -> None:
    c = model.config
    if c.num_hidden_layers >= num_target_layers:
        raise WarmStartError(f"{c.num_hidden_layers} draft layers cannot be copied from a {num_target_layers}-layer "
                             f"target")
    need = required_feature_layer(num_target_layers, c.num_hidden_layers)
    if c.target_layer_ids[-1] != need:
        raise WarmStartError(
            f"--init-from-target with {c.num_hidden_layers} draft layers copies target layers "
            f"{copied_layer_ids(num_target_layers, c.num_hidden_layers)}, so the last feature layer must be {need} "
            f"(the input of the first copied layer); the cache holds {c.target_layer_ids}. Capture with "
            f"--target-layer-ids ending in {need}")


@torch.no_grad()
def mlp_channel_importance(target_path: str, layer_ids: list[int], sequences: list[torch.Tensor],
                           max_tokens: int = 512) -> dict[int, torch.Tensor]:
    """Per target layer, mean |silu(gate) * up| per MLP channel over `sequences`, times |down_proj column|."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    layers = model.get_decoder().layers
    sums = {i: torch.zeros(layers[i].mlp.down_proj.in_features, dtype=torch.float64) for i in layer_ids}
    count = 0
    hooks = []
    for i in layer_ids:
        def pre(_m, inputs, i=i):
            sums[i] += inputs[0].abs().double().reshape(-1, inputs[0].shape[-1]).sum(0)
        hooks.append(layers[i].mlp.down_proj.register_forward_pre_hook(pre))
    try:
        for ids in sequences:
            ids = ids[:max_tokens].long()[None]
            model.get_decoder()(input_ids=ids)
            count += ids.shape[1]
    finally:
        for h in hooks:
            h.remove()
    if count == 0:
        raise WarmStartError("no tokens to measure MLP channel importance on")
    return {i: (sums[i] / count).float() * layers[i].mlp.down_proj.weight.float().norm(dim=0) for i in layer_ids}


def keep_channels(importance: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most important channel ids, in their original order."""
    return importance.topk(size).indices.sort().values


@torch.no_grad()
def init_from_target(model: DSparkDraftModel, target_path: str, num_target_layers: int,
                     sequences: list[torch.Tensor] | None = None) -> dict:
    """Overwrite `model`'s draft layers, norms, fc, Markov W2 and confidence head as described above."""
    check_compatible(model, num_target_layers)
    c = model.config
    src = copied_layer_ids(num_target_layers, c.num_hidden_layers)
    names = [f"layers.{i}.self_attn.{n}" for i in src for n in ATTN]
    names += [f"layers.{i}.mlp.{n}" for i in src for n in MLP]
    names += [f"layers.{i}.{n}.weight" for i in src for n in ("input_layernorm", "post_attention_layernorm")]
    names.append("norm.weight")
    t = read_target_tensors(target_path, names)
    target_inter = t[f"layers.{src[0]}.mlp.up_proj.weight"].shape[0]
    keep: dict[int, torch.Tensor] = {}
    if c.intermediate_size > target_inter:
        raise WarmStartError(f"intermediate_size {c.intermediate_size} exceeds the target's {target_inter}")
    if c.intermediate_size < target_inter:
        if not sequences:
            raise WarmStartError("a drafter narrower than the target needs sequences to rank MLP channels on")
        imp = mlp_channel_importance(target_path, src, sequences)
        keep = {i: keep_channels(imp[i], c.intermediate_size) for i in src}

    def put(param: torch.nn.Parameter, name: str) -> None:
        if name not in t:
            raise WarmStartError(f"{target_path}: no tensor '*{name}' to copy into the drafter")
        if tuple(t[name].shape) != tuple(param.shape):
            raise WarmStartError(f"target '{name}' has shape {tuple(t[name].shape)}, the drafter's "
                                 f"{tuple(param.shape)}")
        param.copy_(t[name].to(param.dtype))

    for layer, i in zip(model.layers, src):
        a = layer.self_attn
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            proj = getattr(a, n)
            put(proj.weight, f"layers.{i}.self_attn.{n}.weight")
            if proj.bias is not None:
                put(proj.bias, f"layers.{i}.self_attn.{n}.bias")
        for n in ("q_norm", "k_norm"):
            if getattr(a, n) is not None:
                put(getattr(a, n).weight, f"layers.{i}.self_attn.{n}.weight")
        put(layer.input_layernorm.weight, f"layers.{i}.input_layernorm.weight")
        put(layer.post_attention_layernorm.weight, f"layers.{i}.post_attention_layernorm.weight")
        for n in MLP:
            name = f"layers.{i}.mlp.{n}"
            if i in keep:
                t[name] = t[name][:, keep[i]] if n == "down_proj.weight" else t[name][keep[i]]
            put(getattr(layer.mlp, n.split(".")[0]).weight, name)
    put(model.norm.weight, "norm.weight")
    put(model.hidden_norm.weight, f"layers.{src[0]}.input_layernorm.weight")
    d = c.hidden_size
    model.fc.weight.zero_()
    model.fc.weight[:, (c.num_target_features - 1) * d:] = torch.eye(d, dtype=model.fc.weight.dtype)
    if model.markov_head is not None:
        model.markov_head.markov_w2.weight.zero_()
    if model.confidence_head is not None:
        model.confidence_head.proj.weight.zero_()
        model.confidence_head.proj.bias.zero_()
    return {"copied_layers": src, "pruned_to": c.intermediate_size if keep else None,
            "target_intermediate_size": target_inter}
