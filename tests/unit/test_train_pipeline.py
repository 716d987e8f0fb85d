"""capture -> fit -> resume -> calibrate on a tiny random Qwen3 / Qwen2 target (CPU, seconds)."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from sglang_dspark.drafter import DSparkConfig, load_drafter, load_sts
from sglang_dspark.train.__main__ import main
from sglang_dspark.train.cache import CacheReader
from sglang_dspark.train.tiny import make_tiny_conversations, make_tiny_target


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tiny tensors: intra-op threading only adds pool wake-ups (ms per softmax on this shared 2-core box).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


FIT = ["--layers", "1", "--block-size", "3", "--markov-rank", "4", "--intermediate-size", "32", "--num-anchors",
       "64", "--batch", "3", "--lr", "5e-3", "--warmup-ratio", "0", "--holdout-fraction", "0.3",
       "--save-every", "3", "--log-every", "1", "--max-length", "96"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    make_tiny_target(str(root / "q3"), "qwen3", num_layers=3, hidden_size=32)
    make_tiny_conversations(str(root / "conv.jsonl"), n=6)
    main(["capture", "--target", str(root / "q3"), "--data", str(root / "conv.jsonl"), "--out",
          str(root / "cache"), "--target-layer-ids", "0,1", "--shard-samples", "4", "--dtype", "fp32",
          "--min-loss-tokens", "5", "--max-length", "96"])
    return root


def test_capture_cache_layout_and_hidden_convention(workdir):
    from transformers import AutoModelForCausalLM

    cache = CacheReader(str(workdir / "cache"))
    assert len(cache) == 6 and cache.manifest["target_layer_ids"] == [0, 1]
    assert cache.manifest["tokenizer_size"] < cache.manifest["vocab_size"]
    s = cache[0]
    S = s["input_ids"].shape[0]
    assert s["hidden"].shape == (S, 64) and s["last_hidden"].shape == (S, 32) and s["hidden"].dtype == torch.bfloat16
    assert 0 < int(s["loss_mask"].sum()) < S
    model = AutoModelForCausalLM.from_pretrained(str(workdir / "q3"), dtype=torch.float32)
    with torch.no_grad():
        hs = model(s["input_ids"].long()[None], output_hidden_states=True).hidden_states
    # raw output of layer l == HF hidden_states[l + 1]; last_hidden == final-normed state
    assert torch.allclose(s["hidden"][:, :32].float(), hs[1][0], atol=3e-2, rtol=1e-2)
    assert torch.allclose(s["hidden"][:, 32:].float(), hs[2][0], atol=3e-2, rtol=1e-2)
    assert torch.allclose(s["last_hidden"].float(), hs[3][0], atol=3e-2, rtol=1e-2)
    # resumable by id: a rerun with two more conversations captures only those
    make_tiny_conversations(str(workdir / "more.jsonl"), n=8)
    rows = [json.loads(x) for x in open(workdir / "more.jsonl")]
    with open(workdir / "more.jsonl", "w") as f:
        for r in rows[6:]:
            f.write(json.dumps(r) + "\n")
    out = main(["capture", "--target", str(workdir / "q3"), "--data", str(workdir / "conv.jsonl"), "--data",
                str(workdir / "more.jsonl"), "--out", str(workdir / "cache2"), "--target-layer-ids", "0,1",
                "--dtype", "fp32", "--min-loss-tokens", "5", "--max-length", "96", "--limit", "3"])
    assert out["captured"] == 3
    out = main(["capture", "--target", str(workdir / "q3"), "--data", str(workdir / "conv.jsonl"), "--data",
                str(workdir / "more.jsonl"), "--out", str(workdir / "cache2"), "--target-layer-ids", "0,1",
                "--dtype", "fp32", "--min-loss-tokens", "5", "--max-length", "96"])
    assert out["captured"] == 5 and len(CacheReader(str(workdir / "cache2"))) == 8


def test_fit_decreases_loss_resumes_and_calibrates(workdir):
    run = workdir / "run"
    res = main(["fit", "--cache", str(workdir / "cache"), "--out", str(run), "--steps", "6", *FIT])
    losses = [h["loss"] for h in res["history"]]
    assert losses[-1] < losses[0] - 0.05, losses
    assert sorted(os.listdir(run)) == ["latest", "step_3", "step_6", "train_log.jsonl"]
    cfg = DSparkConfig.from_json(run / "step_6")
    assert cfg.mask_token_id == CacheReader(str(workdir / "cache")).manifest["tokenizer_size"]
    final = load_file(str(run / "step_6" / "model.safetensors"))
    assert "embed_tokens.weight" in final  # DeepSpec layout: shared tensors stored by default

    # Interrupt after step 3: drop step 6, point latest at step 3, rerun -> same final weights.
    shutil.rmtree(run / "step_6")
    (run / "latest").write_text("step_3\n")
    res2 = main(["fit", "--cache", str(workdir / "cache"), "--out", str(run), "--steps", "6", *FIT,
                 "--save-dtype", "bf16"])
    assert [h["step"] for h in res2["history"]] == [4, 5, 6]
    assert res2["history"][-1]["loss"] == pytest.approx(res["history"][-1]["loss"], rel=1e-4)
    again = load_file(str(run / "step_6" / "model.safetensors"))
    for k, v in final.items():
        assert torch.allclose(v.float(), again[k].float(), atol=1e-2), k

    out = main(["calibrate", "--cache", str(workdir / "cache"), "--drafter", str(run / "step_6"),
                "--holdout-fraction", "0.3", "--max-length", "96"])
    temps = load_sts(run / "step_6" / "sts.json")
    assert len(temps) == 3 and temps == out["temperatures"]
    assert out["ece_sts"] <= out["ece_raw"] + 1e-9
    assert 1.0 <= out["heldout_tau"] <= 4.0 and len(out["heldout_cond_accept"]) == 3
    assert all(0.0 <= a <= 1.0 for a in out["heldout_cond_accept"])
    assert load_drafter(run / "step_6").sts_temperatures == temps


def test_fit_qwen2_dflash_ablation(tmp_path):
    make_tiny_target(str(tmp_path / "q2"), "qwen2", num_layers=3, hidden_size=32)
    make_tiny_conversations(str(tmp_path / "conv.jsonl"), n=3)
    main(["capture", "--target", str(tmp_path / "q2"), "--data", str(tmp_path / "conv.jsonl"), "--out",
          str(tmp_path / "cache"), "--target-layer-ids", "1", "--dtype", "fp32", "--min-loss-tokens", "5",
          "--max-length", "160", "--system-prompt", ""])
    res = main(["fit", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "run"), "--steps", "2",
                "--layers", "1", "--block-size", "3", "--markov-rank", "0", "--no-confidence-head",
                "--ce-weight", "1", "--l1-weight", "0", "--conf-weight", "0", "--num-anchors", "8",
                "--batch", "1", "--holdout-fraction", "0", "--max-length", "160", "--no-save-shared"])
    assert len(res["history"]) == 2 and res["history"][-1]["conf"] == 0.0
    cfg = DSparkConfig.from_json(tmp_path / "run" / "step_2")
    assert cfg.qk_norm is False and cfg.attention_bias and cfg.markov_rank == 0
    keys = load_file(str(tmp_path / "run" / "step_2" / "model.safetensors")).keys()
    assert "layers.0.self_attn.q_proj.bias" in keys and "lm_head.weight" not in keys


def test_generate_stage_is_wired_to_the_sglang_stage():
    from sglang_dspark.train.__main__ import build_parser

    args = build_parser().parse_args(["generate", "--limit", "3", "--out", "x.jsonl"])
    assert args.stage == "generate" and args.limit == 3 and args.out == "x.jsonl"


def test_target_statistics_are_exact_and_fit_uses_them(workdir):
    """`train targets` stores top-k ids + log-sum-exp; a sampled-vocabulary fit step on them gives the same loss as
    one that runs the full lm_head (same seed, same candidate vocabulary)."""
    from sglang_dspark.train.target import load_target_shared_weights
    from sglang_dspark.train.target_stats import LEADING_ROWS

    plain, stats = workdir / "cache_plain", workdir / "cache_stats"
    for d in (plain, stats):
        shutil.copytree(workdir / "cache", d)
    out = main(["targets", "--cache", str(stats), "--top-k", "6"])
    assert out["written"] == out["shards"] == 2
    assert main(["targets", "--cache", str(stats), "--top-k", "6"])["written"] == 0  # resumes: nothing left
    cache = CacheReader(str(stats))
    assert cache.has_targets and not CacheReader(str(plain)).has_targets
    _, head = load_target_shared_weights(cache.manifest["target"])
    s = max((cache[i] for i in range(len(cache))), key=lambda x: int(torch.nonzero(x["loss_mask"])[0]))
    logits = s["last_hidden"].float() @ head.float().T
    rows = torch.isfinite(s["lse"])
    first_loss = int(torch.nonzero(s["loss_mask"]).flatten()[0])
    assert bool(rows[first_loss - 1:].all()) and bool(rows[:LEADING_ROWS].all())
    assert rows.sum() < len(rows) or first_loss <= LEADING_ROWS + 1  # a long prompt's middle is skipped
    assert torch.allclose(s["lse"][rows], torch.logsumexp(logits, -1)[rows], atol=1e-5)
    assert torch.equal(s["topk_ids"].long()[rows], logits.topk(6, -1).indices[rows])

    sampled = ["--steps", "1", *FIT, "--vocab-sample-top-k", "4", "--vocab-sample-negatives", "5",
               "--amp", "none"]  # exact: bf16 autocast (on by default on AMX CPUs) rounds the two paths apart
    a = main(["fit", "--cache", str(plain), "--out", str(workdir / "run_plain"), *sampled])["history"][0]
    b = main(["fit", "--cache", str(stats), "--out", str(workdir / "run_stats"), *sampled])["history"][0]
    for key in ("loss", "ce", "l1", "conf"):
        assert b[key] == pytest.approx(a[key], rel=1e-4), key
    with pytest.raises(ValueError, match="top-6"):
        main(["fit", "--cache", str(stats), "--out", str(workdir / "run_k"), "--steps", "1", *FIT,
              "--vocab-sample-top-k", "8"])


def test_fit_init_from_starts_at_the_checkpoint_with_a_fresh_schedule(workdir):
    fresh = main(["fit", "--cache", str(workdir / "cache"), "--out", str(workdir / "init_a"), "--steps", "8", *FIT])
    warm = main(["fit", "--cache", str(workdir / "cache"), "--out", str(workdir / "init_b"), "--steps", "2", *FIT,
                 "--init-from", str(workdir / "init_a" / "step_6"), "--num-anchors", "16"])
    assert [h["step"] for h in warm["history"]] == [1, 2]
    assert warm["history"][0]["loss"] < fresh["history"][0]["loss"] - 0.05
    assert DSparkConfig.from_json(workdir / "init_b" / "step_2").num_anchors == 16
    from safetensors.torch import save_file

    broken = workdir / "init_broken"
    shutil.copytree(workdir / "init_a" / "step_6", broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["fc.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="fc.weight"):
        main(["fit", "--cache", str(workdir / "cache"), "--out", str(workdir / "init_c"), "--steps", "1", *FIT,
              "--init-from", str(broken)])


def test_rows_fit_reads_skips_only_the_middle_of_a_long_prompt():
    from sglang_dspark.train.target_stats import LEADING_ROWS, rows_fit_reads

    lm = torch.zeros(100, dtype=torch.uint8)
    lm[60:90] = 1
    rows = rows_fit_reads(lm)
    assert bool(rows[:LEADING_ROWS].all()) and bool(rows[59:].all()) and not bool(rows[LEADING_ROWS:59].any())
    assert bool(rows_fit_reads(torch.zeros(10, dtype=torch.uint8))[:10].all())


def test_target_labels_supervise_the_targets_argmax(workdir):
    """--ce-labels target: CE (and the logged top-1) against the target's greedy token, not the text's."""
    from sglang_dspark.train.losses import target_argmax

    cache = CacheReader(str(workdir / "cache"))
    s = cache[0]
    anchors = torch.tensor([[0, 3, 5]])
    tlogits = torch.randn(1, 3, 4, 300)
    assert torch.equal(target_argmax(s, tlogits, anchors, 4, 20, 96), tlogits.argmax(-1))
    s = dict(s, topk_ids=torch.arange(40)[:, None].repeat(1, 3) * 7)  # top-1 at position p is 7p
    want = (anchors[0][:, None] + torch.arange(4)) * 7
    assert torch.equal(target_argmax(s, None, anchors, 4, 40, 96)[0], want)
    run = workdir / "run_target_labels"
    res = main(["fit", "--cache", str(workdir / "cache"), "--out", str(run), "--steps", "3", "--ce-labels", "target",
                *FIT])
    assert all(0.0 <= h["top1"] <= 1.0 for h in res["history"])
