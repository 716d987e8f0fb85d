"""DeepSpec-format checkpoints: strict loading, save/load round trips, errors that name the bad key."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_dspark.drafter import (DrafterCheckpointError, DrafterConfigError, DSparkConfig, DSparkDraftModel,
                                   StsFileError, load_drafter, save_drafter, save_sts)

V, D = 96, 32


def tiny_config_dict(**over):
    d = {  # Qwen3-shaped, keys as in a released DeepSpec config.json
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "hidden_size": D, "intermediate_size": 48,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
        "max_position_embeddings": 4096, "vocab_size": V, "attention_bias": False, "num_hidden_layers": 2,
        "num_target_layers": 8, "block_size": 4, "mask_token_id": V - 1, "target_layer_ids": [1, 3, 5],
        "num_anchors": 16, "layer_types": ["full_attention"] * 2, "tie_word_embeddings": False,
        "markov_rank": 8, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True, "bos_token_id": 0, "eos_token_id": 1, "dtype": "bfloat16",
    }
    d.update(over)
    return d


def deepspec_names(L, head):
    names = ["embed_tokens.weight", "lm_head.weight", "fc.weight", "hidden_norm.weight", "norm.weight",
             "markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
             "confidence_head.proj.bias"]
    for i in range(L):
        p = f"layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
        names += [p + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    if head == "gated":
        names += ["markov_head.gate_proj.weight", "markov_head.gate_proj.bias"]
    if head == "rnn":
        names += ["markov_head.joint_proj.weight", "markov_head.joint_proj.bias"]
    return set(names)


def write_checkpoint(path, cfg_dict, seed=0):
    """Write a checkpoint by hand (not via save_drafter), as DeepSpec would: config.json + model.safetensors."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg_dict, f)
    torch.manual_seed(seed)
    model = DSparkDraftModel(DSparkConfig.from_dict(cfg_dict))
    for p in model.parameters():  # non-trivial values everywhere, norms included
        p.data.normal_(0, 0.3)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()},
              os.path.join(path, "model.safetensors"))
    return path


def logits_of(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 1, (1, 12), generator=g)
    hid = torch.randn(1, 12, 3 * D, generator=g)
    lm = torch.ones(1, 12)
    anchors, keep = torch.tensor([[3, 6]]), torch.tensor([[True, True]])
    with torch.no_grad():
        logits, conf, _, _ = model.forward_train(ids, hid, lm, anchors, keep)
    return logits, conf


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_deepspec_checkpoint_loads_strictly_with_exact_names(tmp_path, head):
    path = write_checkpoint(tmp_path / "ck", tiny_config_dict(markov_head_type=head))
    names = set(load_file(os.path.join(path, "model.safetensors")).keys())
    assert names == deepspec_names(2, head)
    model = load_drafter(path, dtype=torch.float32)
    assert set(model.state_dict().keys()) == names
    assert not model.embed_tokens.weight.requires_grad and not model.lm_head.weight.requires_grad
    assert model.fc.weight.shape == (D, 3 * D) and model.confidence_head.proj.weight.shape == (1, D + 8)


@pytest.mark.parametrize("include_shared", [True, False])
def test_save_load_round_trip_gives_identical_logits(tmp_path, include_shared):
    src = load_drafter(write_checkpoint(tmp_path / "src", tiny_config_dict()), dtype=torch.float32)
    save_drafter(src, tmp_path / "out", include_shared=include_shared)
    stored = set(load_file(str(tmp_path / "out" / "model.safetensors")).keys())
    assert ("embed_tokens.weight" in stored) == include_shared and ("lm_head.weight" in stored) == include_shared
    if include_shared:
        dst = load_drafter(tmp_path / "out", dtype=torch.float32)
    else:
        with pytest.raises(DrafterCheckpointError, match="embed_tokens.weight"):
            load_drafter(tmp_path / "out", dtype=torch.float32)
        dst = load_drafter(tmp_path / "out", target_embed=src.embed_tokens.weight.detach(),
                           target_lm_head=src.lm_head.weight.detach(), dtype=torch.float32)
    a, b = logits_of(src), logits_of(dst)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert DSparkConfig.from_json(tmp_path / "out") == src.config


def test_bfloat16_load_runs(tmp_path):
    model = load_drafter(write_checkpoint(tmp_path / "ck", tiny_config_dict()), dtype=torch.bfloat16)
    assert model.fc.weight.dtype == torch.bfloat16
    logits, conf = logits_of(model)
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all() and torch.isfinite(conf).all()


def test_missing_tensor_names_the_key(tmp_path):
    path = write_checkpoint(tmp_path / "ck", tiny_config_dict())
    st = load_file(os.path.join(path, "model.safetensors"))
    del st["layers.1.mlp.up_proj.weight"]
    save_file(st, os.path.join(path, "model.safetensors"))
    with pytest.raises(DrafterCheckpointError, match=r"layers\.1\.mlp\.up_proj\.weight.*\[48, 32\]"):
        load_drafter(path)


def test_wrong_shape_names_key_and_both_shapes(tmp_path):
    path = write_checkpoint(tmp_path / "ck", tiny_config_dict())
    st = load_file(os.path.join(path, "model.safetensors"))
    st["fc.weight"] = torch.zeros(D, 2 * D, dtype=torch.bfloat16)
    save_file(st, os.path.join(path, "model.safetensors"))
    with pytest.raises(DrafterCheckpointError, match=r"fc\.weight.*expected shape \[32, 96\], found \[32, 64\]"):
        load_drafter(path)


def test_unexpected_tensor_names_the_key(tmp_path):
    path = write_checkpoint(tmp_path / "ck", tiny_config_dict())
    st = load_file(os.path.join(path, "model.safetensors"))
    st["layers.2.mlp.up_proj.weight"] = torch.zeros(48, D, dtype=torch.bfloat16)
    save_file(st, os.path.join(path, "model.safetensors"))
    with pytest.raises(DrafterCheckpointError, match=r"unexpected tensor 'layers\.2\.mlp\.up_proj\.weight'"):
        load_drafter(path)


@pytest.mark.parametrize("change, key", [
    ({"markov_head_type": "lstm"}, "markov_head_type"),
    ({"target_layer_ids": [3, 1, 5]}, "target_layer_ids"),
    ({"target_layer_ids": [1, 3, 8]}, "target_layer_ids"),
    ({"mask_token_id": V}, "mask_token_id"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"architectures": ["DFlashDraftModel"]}, "architectures"),
    ({"block_size": None}, "block_size"),
])
def test_bad_config_names_the_key(tmp_path, change, key):
    path = write_checkpoint(tmp_path / "ck", tiny_config_dict())
    d = tiny_config_dict(**change)
    if d["block_size"] is None:
        del d["block_size"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f)
    with pytest.raises(DrafterConfigError, match=key):
        load_drafter(path)


def test_sts_file_is_attached_and_validated(tmp_path):
    path = write_checkpoint(tmp_path / "ck", tiny_config_dict())
    assert load_drafter(path).sts_temperatures is None
    save_sts(os.path.join(path, "sts.json"), [1.0, 1.5, 2.0, 0.5], {"n": 3})
    assert load_drafter(path).sts_temperatures == [1.0, 1.5, 2.0, 0.5]
    save_sts(os.path.join(path, "sts.json"), [1.0, 1.5], {})
    with pytest.raises(DrafterCheckpointError, match="block_size"):
        load_drafter(path)
    with open(os.path.join(path, "sts.json"), "w") as f:
        json.dump({"format": "dspark-sts-v1", "temperatures": [1.0, -2.0, 1.0, 1.0]}, f)
    with pytest.raises(StsFileError, match="temperatures"):
        load_drafter(path)


def test_rope_theta_legacy_key_and_qwen2_flavour():
    d = tiny_config_dict(model_type="qwen2", attention_bias=True)
    d["rope_theta"] = d.pop("rope_parameters")["rope_theta"]
    cfg = DSparkConfig.from_dict(d)
    assert cfg.rope_theta == 1000000 and cfg.qk_norm is False
    model = DSparkDraftModel(cfg)
    keys = set(model.state_dict().keys())
    assert "layers.0.self_attn.q_proj.bias" in keys and "layers.0.self_attn.o_proj.bias" not in keys
    assert "layers.0.self_attn.q_norm.weight" not in keys
    assert DSparkConfig.from_dict(json.loads(cfg.to_json())) == cfg  # qk_norm survives the round trip


def test_sts_file_keeps_greedy_and_sampled_sets_apart(tmp_path):
    from sglang_dspark.drafter import load_sts

    path = tmp_path / "sts.json"
    save_sts(path, [1.0, 2.0, 3.0, 4.0], {"acceptance": "greedy"})
    assert load_sts(path, "sampled") == [1.0, 2.0, 3.0, 4.0]  # no sampled set yet: the greedy one
    save_sts(path, [0.5, 0.6, 0.7, 0.8], {"acceptance": "T=1"}, regime="sampled")
    assert load_sts(path) == [1.0, 2.0, 3.0, 4.0] and load_sts(path, "sampled") == [0.5, 0.6, 0.7, 0.8]
    save_sts(path, [1.5, 2.0, 3.0, 4.0], {"acceptance": "greedy"})  # a greedy refit keeps the sampled set
    assert load_sts(path, "sampled") == [0.5, 0.6, 0.7, 0.8] and load_sts(path)[0] == 1.5
    model_dir = write_checkpoint(tmp_path / "ckpt", tiny_config_dict())
    os.replace(path, model_dir / "sts.json")
    loaded = load_drafter(model_dir)
    assert loaded.sts_temperatures[0] == 1.5 and loaded.sts_temperatures_sampled == [0.5, 0.6, 0.7, 0.8]
    doc = json.loads((model_dir / "sts.json").read_text())
    doc["temperatures_sampled"] = [1.0, -2.0, 1.0, 1.0]
    (model_dir / "sts.json").write_text(json.dumps(doc))
    with pytest.raises(StsFileError, match="temperatures_sampled"):
        load_drafter(model_dir)


def test_sts_biases_round_trip_per_regime_and_are_validated(tmp_path):
    from sglang_dspark.drafter import load_sts_biases

    path = tmp_path / "sts.json"
    save_sts(path, [1.0, 2.0, 3.0, 4.0], {}, biases=[-0.5, 0.0, 0.25, 1.0])
    assert load_sts_biases(path) == [-0.5, 0.0, 0.25, 1.0]
    assert load_sts_biases(path, "sampled") == [-0.5, 0.0, 0.25, 1.0]  # no sampled set: the greedy one
    save_sts(path, [0.5, 0.6, 0.7, 0.8], {}, regime="sampled")  # a temperature-only sampled set has no biases
    assert load_sts_biases(path, "sampled") is None and load_sts_biases(path) == [-0.5, 0.0, 0.25, 1.0]
    save_sts(path, [0.5, 0.6, 0.7, 0.8], {}, regime="sampled", biases=[1.0, 1.0, 1.0, 1.0])
    save_sts(path, [1.0, 1.0, 1.0, 1.0], {})  # a greedy refit without biases drops the greedy ones only
    assert load_sts_biases(path) is None and load_sts_biases(path, "sampled") == [1.0, 1.0, 1.0, 1.0]
    model_dir = write_checkpoint(tmp_path / "ckpt", tiny_config_dict())
    os.replace(path, model_dir / "sts.json")
    loaded = load_drafter(model_dir)
    assert loaded.sts_biases is None and loaded.sts_biases_sampled == [1.0, 1.0, 1.0, 1.0]
    doc = json.loads((model_dir / "sts.json").read_text())
    doc["biases"] = [0.0, float("nan"), 0.0, 0.0]
    (model_dir / "sts.json").write_text(json.dumps(doc).replace("NaN", '"nan"'))
    with pytest.raises(StsFileError, match="'biases'"):
        load_drafter(model_dir)
    doc["biases"] = [0.0, 0.0]
    (model_dir / "sts.json").write_text(json.dumps(doc))
    with pytest.raises(StsFileError, match="list of 4"):
        load_drafter(model_dir)
