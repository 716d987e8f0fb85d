"""Drafter semantics: masks, serving path == training path, sampling, Markov variants, config rules, STS."""

import pytest
import torch

from sglang_dspark.drafter import (DSparkConfig, DSparkDraftModel, StsFileError, apply_sts, auroc,
                                   default_target_layer_ids, ece, fit_sts, load_sts, sample_anchors, save_sts)
from sglang_dspark.drafter.sts import survival_ece


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py: one torch thread for tiny tensors

V, D, M = 64, 32, 2  # vocab, hidden, captured target layers


def make_model(rank=8, head="vanilla", conf=True, dtype=torch.float32, seed=0):
    d = {"architectures": ["Qwen3DSparkModel"], "hidden_size": D, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0},
         "vocab_size": V, "num_hidden_layers": 2, "num_target_layers": 6, "block_size": 4, "mask_token_id": V - 1,
         "target_layer_ids": [1, 3], "num_anchors": 8, "markov_rank": rank, "enable_confidence_head": conf,
         "confidence_head_with_markov": True}
    if rank:
        d["markov_head_type"] = head
    torch.manual_seed(seed)
    model = DSparkDraftModel(DSparkConfig.from_dict(d))
    for p in model.parameters():
        p.data.normal_(0, 0.5)  # large weights so that perturbations visibly move outputs
    return model.to(dtype).eval()


def context(model, S=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    hid = torch.randn(1, S, M * D, generator=g)
    ctx = model.project_context(hid[0])
    k, v = model.context_kv(ctx, torch.arange(S))
    return hid, k[:, None], v[:, None]  # [L, R=1, C, Hkv, hd]


def test_block_sees_only_valid_context_and_is_bidirectional():
    model = make_model()
    _, k, v = context(model)
    valid = torch.zeros(1, 10, dtype=torch.bool)
    valid[0, :6] = True
    ids = torch.tensor([[5, 7, 9, 11]])
    pos = torch.arange(6, 10)[None]
    with torch.no_grad():
        h = model.backbone(ids, pos, k, v, valid)
        k2, v2 = k.clone(), v.clone()
        k2[:, :, 6:] += 3.0  # masked-out context entries
        v2[:, :, 6:] -= 3.0
        assert torch.allclose(model.backbone(ids, pos, k2, v2, valid), h, atol=1e-6)
        k3 = k.clone()
        k3[:, :, 2] += 3.0  # a valid entry
        assert not torch.allclose(model.backbone(ids, pos, k3, v, valid), h, atol=1e-3)
        ids2 = ids.clone()
        ids2[0, 3] = 13  # the last slot changes -> the first slot's output changes (no causal mask)
        assert not torch.allclose(model.backbone(ids2, pos, k, v, valid)[0, 0], h[0, 0], atol=1e-4)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_serving_path_equals_training_path(head):
    model = make_model(head=head)
    S = 12
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V - 1, (1, S), generator=g)
    hid = torch.randn(1, S, M * D, generator=g)
    lm = torch.ones(1, S)
    anchors = torch.tensor([[2, 5, 9]])
    keep = torch.tensor([[True, True, True]])
    with torch.no_grad():
        logits, conf, labels, emask = model.forward_train(ids, hid, lm, anchors, keep)
        k, v = model.context_kv(model.project_context(hid[0]), torch.arange(S))
        k, v = k[:, None], v[:, None]
        for j, a in enumerate(anchors[0].tolist()):
            valid = (torch.arange(S) < a)[None]
            block_ids, block_pos = model.block_inputs(ids[:, a], torch.tensor([a]))
            h = model.backbone(block_ids, block_pos, k, v, valid)
            prev = torch.cat([ids[:, a:a + 1], labels[:, j, :-1]], dim=-1)
            served = model.lm_head(h).float() + model.markov_head.teacher_forced(h, prev).float()
            assert torch.allclose(served, logits[:, j], atol=1e-4), (head, j)
            assert torch.allclose(model.confidence_logits(h, prev), conf[:, j], atol=1e-5)
            # propose(): slot 0 has prev = anchor in both paths
            p = model.propose(ids[:, a], torch.tensor([a]), k, v, valid, torch.zeros(1))
            assert torch.allclose(p.logits[:, 0], logits[:, j, 0], atol=1e-4)
            assert torch.allclose(p.conf_logits[:, 0], conf[:, j, 0], atol=1e-5)
    assert torch.equal(labels[0, 0], ids[0, 3:7])
    assert emask[0, 2].tolist() == [True, True, False, False]  # labels past the end of the sequence


def test_forward_train_mask_follows_loss_mask_and_keep():
    model = make_model()
    ids = torch.randint(0, V - 1, (1, 12))
    lm = torch.ones(1, 12)
    lm[0, 6] = 0
    anchors, keep = torch.tensor([[3, 0]]), torch.tensor([[True, False]])
    _, _, _, emask = model.forward_train(ids, torch.randn(1, 12, M * D), lm, anchors, keep)
    assert emask[0, 0].tolist() == [True, True, False, False]  # label at 6 is not a loss token -> cut the prefix
    assert not emask[0, 1].any()


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_propose_greedy_is_deterministic_and_sampling_reproducible(head):
    model = make_model(head=head)
    _, k, v = context(model)
    k, v = k.expand(-1, 2, -1, -1, -1), v.expand(-1, 2, -1, -1, -1)
    valid = torch.ones(2, 10, dtype=torch.bool)
    anchor, pos = torch.tensor([3, 8]), torch.tensor([10, 10])
    p1 = model.propose(anchor, pos, k, v, valid, torch.zeros(2))
    p2 = model.propose(anchor, pos, k, v, valid, torch.zeros(2))
    assert torch.equal(p1.tokens, p2.tokens) and torch.equal(p1.tokens, p1.logits.argmax(-1))
    assert p1.tokens.shape == (2, 4) and p1.logits.shape == (2, 4, V) and p1.conf_logits.shape == (2, 4)
    t = torch.tensor([0.0, 1.0])
    s1 = model.propose(anchor, pos, k, v, valid, t, torch.Generator().manual_seed(7))
    s2 = model.propose(anchor, pos, k, v, valid, t, torch.Generator().manual_seed(7))
    assert torch.equal(s1.tokens, s2.tokens)
    assert torch.equal(s1.tokens[0], p1.tokens[0])  # the T=0 row stays greedy inside a mixed batch
    # Sequential Markov feedback: slot 1's correction depends on the token drawn at slot 0.
    if head != "rnn":
        h = model.backbone(*model.block_inputs(anchor, pos), k, v, valid)
        corr = model.markov_head.step(h[:, 1], s1.tokens[:, 0])[0]
        assert torch.allclose(s1.logits[:, 1], model.lm_head(h[:, 1]) + corr, atol=1e-4)


def test_rnn_teacher_forced_equals_sequential_steps():
    model = make_model(head="rnn")
    h, prev = torch.randn(3, 4, D), torch.randint(0, V, (3, 4))
    state, outs = None, []
    for kk in range(4):
        c, state = model.markov_head.step(h[:, kk], prev[:, kk], state)
        outs.append(c)
    assert torch.allclose(model.markov_head.teacher_forced(h, prev), torch.stack(outs, 1), atol=1e-6)
    c0 = model.markov_head.step(h[:, 1], prev[:, 1], None)[0]
    assert not torch.allclose(c0, outs[1], atol=1e-4)  # the state carries information across positions


def test_rank_zero_is_plain_dflash():
    model = make_model(rank=0, conf=False)
    assert model.markov_head is None and model.confidence_head is None
    assert not any(k.startswith(("markov_head", "confidence_head")) for k in model.state_dict())
    _, k, v = context(model)
    valid = torch.ones(1, 10, dtype=torch.bool)
    p = model.propose(torch.tensor([4]), torch.tensor([10]), k, v, valid, torch.zeros(1))
    h = model.backbone(*model.block_inputs(torch.tensor([4]), torch.tensor([10])), k, v, valid)
    assert torch.allclose(p.logits, model.lm_head(h), atol=1e-5)
    assert torch.equal(p.conf_logits, torch.zeros(1, 4))


def test_bfloat16_propose_runs():
    model = make_model(dtype=torch.bfloat16)
    _, k, v = context(model)
    p = model.propose(torch.tensor([4]), torch.tensor([10]), k, v, torch.ones(1, 10, dtype=torch.bool),
                      torch.ones(1), torch.Generator().manual_seed(0))
    assert p.logits.dtype == torch.float32 and torch.isfinite(p.logits).all()


def test_sample_anchors_respects_loss_mask_and_pads_with_dummies():
    lm = torch.zeros(2, 20)
    lm[0, 5:12] = 1
    lm[1, 2:20] = 1
    anchors, keep = sample_anchors(lm, 10, torch.Generator().manual_seed(0))
    assert keep[0].sum() == 6 and anchors[0, :6].tolist() == list(range(5, 11))  # all 6 candidates, sorted
    assert (anchors[0, 6:] == 0).all() and not keep[0, 6:].any()
    a1 = anchors[1][keep[1]]
    assert keep[1].all() and len(set(a1.tolist())) == 10 and (a1.diff() > 0).all()
    assert ((a1 >= 2) & (a1 <= 18)).all()


def test_for_target_layer_rule_and_mask_token():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(40, 5) == [1, 10, 19, 28, 37]
    target = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": 300,
              "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "num_hidden_layers": 36,
              "tie_word_embeddings": True}
    cfg = DSparkConfig.for_target(target, num_layers=5, block_size=7, markov_rank=16, tokenizer_size=290)
    assert cfg.target_layer_ids == [1, 9, 17, 25, 33] and cfg.mask_token_id == 290 and cfg.qk_norm
    assert cfg.num_target_layers == 36 and cfg.num_hidden_layers == 5 and cfg.markov_head_type == "vanilla"
    with pytest.raises(ValueError, match="mask_token_id"):
        DSparkConfig.for_target(target, tokenizer_size=300)
    q2 = dict(target, model_type="qwen2")
    cfg2 = DSparkConfig.for_target(q2, markov_rank=0, mask_token_id=5, intermediate_size=96)
    assert not cfg2.qk_norm and cfg2.attention_bias and cfg2.intermediate_size == 96 and cfg2.markov_head_type is None


def synthetic_overconfident(n=4000, B=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    true_p = torch.rand(n, B, generator=g) * 0.8 + 0.1
    accepted = torch.rand(n, B, generator=g) < true_p
    prefix_len = accepted.long().cumprod(-1).sum(-1)
    z = torch.logit(true_p) * 3.0  # overconfident head: logits 3x too large
    return z, prefix_len


def test_sts_fit_reduces_ece_and_round_trips(tmp_path):
    z, acc = synthetic_overconfident()
    temps = fit_sts(z, acc)
    assert len(temps) == 4 and all(2.0 < t < 4.5 for t in temps)  # recovers the 3x over-confidence
    raw, cal = survival_ece(z, acc, None), survival_ece(z, acc, None, temps)
    assert cal < 0.5 * raw
    p = apply_sts(z, temps)
    assert torch.allclose(p[:, 1], torch.sigmoid(z[:, 1] / temps[1]))
    save_sts(tmp_path / "sts.json", temps, {"n": 4000})
    assert load_sts(tmp_path / "sts.json") == temps
    (tmp_path / "bad.json").write_text('{"format": "other", "temperatures": [1]}')
    with pytest.raises(StsFileError, match="format"):
        load_sts(tmp_path / "bad.json")


def test_sts_ignores_unverified_positions():
    z, acc = synthetic_overconfident(n=2000)
    verified = torch.full((2000,), 2)  # positions 2, 3 never verified -> no evidence -> T = 1
    temps = fit_sts(z, acc.clamp(max=2), verified)
    assert temps[2] == 1.0 and temps[3] == 1.0 and temps[0] > 2.0


def test_ece_and_auroc_on_known_values():
    assert ece(torch.tensor([0.9, 0.9, 0.1, 0.1]), torch.tensor([1, 1, 0, 0])) == pytest.approx(0.1)
    assert ece(torch.tensor([0.5, 0.5]), torch.tensor([1, 0])) == pytest.approx(0.0)
    assert auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.75)
    assert auroc(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0, 1, 1])) == pytest.approx(0.5)


@pytest.mark.parametrize("head", ["vanilla", "rnn"])
def test_forward_train_vocab_subset_equals_full_columns(head):
    """Sampled-vocabulary training: the restricted logits are exactly the full logits' columns."""
    model = make_model(head=head)
    ids = torch.randint(0, V - 1, (1, 12), generator=torch.Generator().manual_seed(3))
    hid, lm = torch.randn(1, 12, M * D), torch.ones(1, 12)
    anchors, keep = torch.tensor([[2, 5]]), torch.tensor([[True, True]])
    full, conf, _, _ = model.forward_train(ids, hid, lm, anchors, keep)
    vocab = torch.tensor([0, 3, 7, 20, 41, 63])
    sub, conf_sub, _, _ = model.forward_train(ids, hid, lm, anchors, keep, vocab)
    torch.testing.assert_close(sub, full[..., vocab], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(conf_sub, conf)


def test_propose_with_triton_sampler_equals_torch_loop_when_greedy():
    """The CUDA path of propose (Triton Markov sampler, interpreter here) gives the torch loop's greedy tokens,
    logits and confidences."""
    import os

    from dspark_kernels._rng import HAS_TRITON

    if not HAS_TRITON or (not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"):
        pytest.skip("needs triton (and TRITON_INTERPRET=1 without CUDA; tests/conftest.py sets it)")
    model = make_model(rank=8, head="vanilla")
    hid, k, v = context(model, S=10)
    anchor, pos = torch.tensor([5]), torch.tensor([10])
    valid = torch.ones(1, 10, dtype=torch.bool)
    temp = torch.zeros(1)
    ref = model.propose(anchor, pos, k, v, valid, temp, sampler="torch")
    got = model.propose(anchor, pos, k, v, valid, temp, sampler="triton")
    assert torch.equal(got.tokens, ref.tokens)
    torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.conf_logits, ref.conf_logits, rtol=1e-4, atol=1e-4)
