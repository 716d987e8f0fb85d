"""`train fit --init-from-target`: the drafter starts as the target's own upper layers (tiny random Qwen2 / Qwen3)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang_dspark.drafter import DSparkConfig, DSparkDraftModel
from sglang_dspark.drafter.model import rope_cos_sin
from sglang_dspark.train.target import read_target_config
from sglang_dspark.train.tiny import make_tiny_cache, make_tiny_target
from sglang_dspark.train.warm_start import (WarmStartError, init_from_target, keep_channels,
                                            mlp_channel_importance)


def _drafter(path, layers=2, feature_ids=(0, 1), intermediate=None):
    cfg = DSparkConfig.for_target(read_target_config(path), num_layers=layers, block_size=3, markov_rank=4,
                                  intermediate_size=intermediate, target_layer_ids=list(feature_ids),
                                  mask_token_id=260, markov_head_type="vanilla")
    torch.manual_seed(1)
    return DSparkDraftModel(cfg)


def _causal_layer(layer, model, h):
    """One draft layer over h [1, T, d] with causal self-attention and no injected context."""
    T = h.shape[1]
    cos, sin = rope_cos_sin(torch.arange(T)[None], model.config.head_dim, model.config.rope_theta, h.dtype)
    hkv, hd = model.config.num_key_value_heads, model.config.head_dim
    empty = torch.zeros(1, 0, hkv, hd)
    mask = torch.ones(T, T, dtype=torch.bool).tril()[None]
    return layer(h, cos, sin, empty, empty, mask)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_copied_layers_compute_what_the_target_computes(tmp_path, family):
    target, _ = make_tiny_target(str(tmp_path), family, num_layers=4, hidden_size=32)
    model = _drafter(str(tmp_path))
    info = init_from_target(model, str(tmp_path), 4)
    assert info["copied_layers"] == [2, 3] and info["pruned_to"] is None
    ids = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states  # hs[l + 1] = output of layer l; hs[4] normed
        feats = torch.cat([hs[1], hs[2]], dim=-1)
        # the projected context is the first copied layer's normed input: its K/V are the target's own
        ctx = model.project_context(feats)
        ref = target.model.layers[2].input_layernorm(hs[2])
        assert torch.allclose(ctx, ref, atol=1e-5)
        assert torch.allclose(model.layers[0].self_attn.k_proj(ctx), target.model.layers[2].self_attn.k_proj(ref))
        # each copied layer maps the target's residual stream like the target's layer does
        assert torch.allclose(_causal_layer(model.layers[0], model, hs[2]), hs[3], atol=1e-4)
        assert torch.allclose(model.norm(_causal_layer(model.layers[1], model, hs[3])), hs[4], atol=1e-4)
        # training starts from the copied layers' own predictions: no Markov correction, confidence logit 0
        assert model.markov_head.markov_w2.weight.abs().max() == 0
        h = torch.randn(2, 32)
        assert torch.equal(model.confidence_logits(h, torch.tensor([3, 5])), torch.zeros(2))


def test_a_narrower_drafter_keeps_the_most_important_channels(tmp_path):
    make_tiny_target(str(tmp_path), "qwen2", num_layers=4, hidden_size=32)  # MLP width 64
    target = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    seqs = [torch.randint(0, 256, (20,)) for _ in range(3)]
    model = _drafter(str(tmp_path), intermediate=24)
    info = init_from_target(model, str(tmp_path), 4, seqs)
    assert info["pruned_to"] == 24 and info["target_intermediate_size"] == 64
    imp = mlp_channel_importance(str(tmp_path), [2, 3], seqs)
    for layer, i in zip(model.layers, (2, 3)):
        kept = keep_channels(imp[i], 24)
        assert kept.tolist() == sorted(imp[i].argsort(descending=True)[:24].tolist())
        mlp = target.model.layers[i].mlp
        x = torch.randn(5, 32)
        with torch.no_grad():
            act = torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)
            dropped = torch.ones(64, dtype=torch.bool)
            dropped[kept] = False
            act[:, dropped] = 0
            assert torch.allclose(layer.mlp(x), mlp.down_proj(act), atol=1e-5)


def test_incompatible_drafters_are_refused_with_the_fix(tmp_path):
    make_tiny_target(str(tmp_path), "qwen2", num_layers=4, hidden_size=32)
    with pytest.raises(WarmStartError, match="ending in 1"):
        init_from_target(_drafter(str(tmp_path), feature_ids=(0, 2)), str(tmp_path), 4)
    with pytest.raises(WarmStartError, match="exceeds"):
        init_from_target(_drafter(str(tmp_path), intermediate=128), str(tmp_path), 4)
    with pytest.raises(WarmStartError, match="sequences"):
        init_from_target(_drafter(str(tmp_path), intermediate=24), str(tmp_path), 4)


def test_fit_cli_warm_starts_and_trains(tmp_path):
    from sglang_dspark.drafter import load_drafter
    from sglang_dspark.train.__main__ import main
    from sglang_dspark.train.target import load_target_shared_weights
    make_tiny_cache(str(tmp_path), num_layers=4, n=4)
    fit = ["fit", "--cache", str(tmp_path / "cache"), "--layers", "2", "--block-size", "3", "--markov-rank", "4",
           "--intermediate-size", "24", "--num-anchors", "16", "--batch", "2", "--steps", "2", "--lr", "1e-9",
           "--holdout-fraction", "0.25", "--save-every", "2", "--save-dtype", "fp32", "--max-length", "96"]
    main([*fit, "--out", str(tmp_path / "warm"), "--init-from-target", "--init-channel-samples", "2"])
    embed, head = load_target_shared_weights(str(tmp_path / "t"))
    warm = load_drafter(str(tmp_path / "warm" / "step_2"), embed, head, dtype=torch.float32, draft_vocab=False)
    target = AutoModelForCausalLM.from_pretrained(str(tmp_path / "t"), dtype=torch.float32)
    # a learning rate of 1e-9 leaves the initial weights: the norms are the target's, fc the identity slice
    assert torch.allclose(warm.norm.weight, target.model.norm.weight, atol=1e-6)
    assert torch.allclose(warm.fc.weight[:, 32:], torch.eye(32), atol=1e-6)
    assert warm.fc.weight[:, :32].abs().max() < 1e-6
    with pytest.raises(WarmStartError, match="copies target layers \\[3\\].*ending in 2"):
        main([*fit, "--layers", "1", "--out", str(tmp_path / "bad"), "--init-from-target"])


def test_greedy_chain_counts_drafts_until_the_first_miss_or_off_path_text():
    from sglang_dspark.train.heldout import greedy_chain_lengths

    target = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    draft = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 8], [5, 6, 7, 8], [1, 6, 7, 8]])
    text = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 9, 7, 8], [5, 6, 7, 8]])
    valid = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]).bool()
    assert greedy_chain_lengths(draft, target, text, valid).tolist() == [3, 2, 1, 0]


def test_fit_logs_heldout_acceptance_against_blocks(tmp_path):
    import json

    from sglang_dspark.train.__main__ import main
    make_tiny_cache(str(tmp_path), num_layers=3, n=6)
    main(["fit", "--cache", str(tmp_path / "cache"), "--layers", "1", "--block-size", "3", "--markov-rank", "4",
          "--intermediate-size", "32", "--num-anchors", "8", "--batch", "2", "--steps", "4", "--eval-every", "2",
          "--eval-samples", "2", "--eval-anchors", "8", "--holdout-fraction", "0.4", "--save-every", "4",
          "--max-length", "96", "--out", str(tmp_path / "run")])
    rows = [json.loads(x) for x in open(tmp_path / "run" / "train_log.jsonl")]
    evals = [r for r in rows if "heldout_tau" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert evals[0]["blocks"] == 0 and 0 < evals[1]["blocks"] < evals[2]["blocks"] <= 4 * 2 * 8
    assert all(1.0 <= r["heldout_tau"] <= 4.0 and r["heldout_blocks"] > 0 for r in evals)
