"""Offline eval: end-to-end CLI on a tiny target + random drafter, greedy losslessness, rejection sampling."""

import json
import os

import pytest
import torch

from sglang_dspark import eval_acceptance
from sglang_dspark.drafter import DSparkConfig, DSparkDraftModel, Proposal, save_drafter
from sglang_dspark.eval.spec_decode import autoregressive_generate, speculative_generate, verify_block
from sglang_dspark.train.chat import render_prompt
from sglang_dspark.train.target import HFTarget, read_target_config
from sglang_dspark.train.tiny import make_tiny_prompts, make_tiny_target


pytestmark = pytest.mark.usefixtures("single_thread")  # tests/conftest.py: one torch thread for tiny tensors


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ev")
    model, tok = make_tiny_target(str(root / "target"), "qwen3", num_layers=3, hidden_size=32)
    cfg = DSparkConfig.for_target(read_target_config(str(root / "target")), num_layers=1, block_size=4,
                                  markov_rank=4, target_layer_ids=[0, 1], tokenizer_size=len(tok))
    torch.manual_seed(0)
    drafter = DSparkDraftModel(cfg)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        drafter.lm_head.weight.copy_(model.get_output_embeddings().weight)
    save_drafter(drafter, root / "drafter", include_shared=False)
    make_tiny_prompts(str(root / "a.jsonl"), 3, seed=0)
    make_tiny_prompts(str(root / "b.jsonl"), 3, seed=1)
    return root, model, tok, drafter.eval()


def test_cli_end_to_end_writes_report_and_plots(setup):
    root, *_ = setup
    report = eval_acceptance.main(["--target", str(root / "target"), "--drafter", str(root / "drafter"),
                                   "--dataset", str(root / "a.jsonl"), "--dataset", str(root / "b.jsonl"),
                                   "--limit", "2", "--max-new-tokens", "12", "--temperature", "0", "--dtype",
                                   "fp32", "--json", str(root / "out" / "r.json"), "--plots", str(root / "plots")])
    saved = json.loads((root / "out" / "r.json").read_text())
    for key in ("tau", "tau_by_dataset", "cond_accept_by_position", "ece_raw", "ece_sts", "auc"):
        assert key in saved
    assert set(saved["tau_by_dataset"]) == {"a", "b"} and 1.0 <= saved["tau"] <= 5.0
    assert len(saved["cond_accept_by_position"]) == 4 and saved["ece_sts"] is None  # no sts.json
    assert sorted(os.listdir(root / "plots")) == ["acceptance.png", "reliability.png"]
    assert report["rounds"] == saved["rounds"] > 0


def test_fit_sts_on_free_running_rounds_excludes_training_prompts_and_resumes(setup, monkeypatch):
    root, *_ = setup
    train = [json.loads(line)["turns"][0] for line in (root / "a.jsonl").read_text().splitlines()]
    used = root / "generated.jsonl"  # training data in `train generate`'s format: its prompts must be skipped
    used.write_text(json.dumps({"id": "x", "messages": [{"role": "user", "content": train[0]},
                                                         {"role": "assistant", "content": "ok"}]}) + "\n")
    seen = []
    real = eval_acceptance.speculative_generate

    def spy(target, drafter, prompt_ids, *a, **k):
        seen.append(prompt_ids)
        return real(target, drafter, prompt_ids, *a, **k)

    monkeypatch.setattr(eval_acceptance, "speculative_generate", spy)
    sts = root / "fit" / "sts.json"
    sts.parent.mkdir()
    argv = ["--target", str(root / "target"), "--drafter", str(root / "drafter"), "--dataset", str(root / "a.jsonl"),
            "--exclude-prompts", str(used), "--max-new-tokens", "10", "--temperature", "0", "--dtype", "fp32",
            "--fit-sts", str(sts), "--json", str(root / "fit" / "r.json")]
    report = eval_acceptance.main(argv)
    assert len(seen) == len(train) - 1  # the training prompt was excluded
    doc = json.loads(sts.read_text())
    assert len(doc["temperatures"]) == 4 and doc["num_blocks"] == report["rounds"]
    assert "free-running" in doc["labels"] and report["fitted_sts"]["temperatures"] == doc["temperatures"]
    assert report["ece_sts_floor"] is None  # the tiny drafter has no sts.json of its own
    # a rerun finds every prompt in the rounds log: no decoding, same rounds, same fit
    seen.clear()
    again = eval_acceptance.main(argv)
    assert seen == [] and again["rounds"] == report["rounds"]
    assert again["fitted_sts"]["temperatures"] == report["fitted_sts"]["temperatures"]
    # the sampled regime is added next to the greedy one
    eval_acceptance.main([a if a != "0" else "1" for a in argv])
    assert "temperatures_sampled" in json.loads(sts.read_text())


def test_greedy_speculative_equals_greedy_target(setup):
    root, model, tok, drafter = setup
    target = HFTarget("", [0, 1], model=model)
    for turn in ("count to ten", "x y zz"):
        prompt = render_prompt(tok, turn)
        ref = autoregressive_generate(target, prompt, 20)
        out = speculative_generate(target, drafter, prompt, 20, 0.0)
        assert out.tokens == ref
        assert sum(r.tau for r in out.rounds) + 1 >= 20


class OracleDrafter:
    """Proposes the target's own greedy continuation, corrupting one slot every other round, so the accept,
    reject and bonus paths of the verification loop are all exercised."""

    def __init__(self, real, full_sequence, vocab):
        self.real, self.seq, self.vocab, self.calls = real, full_sequence, vocab, 0
        self.block_size = real.block_size

    def project_context(self, h):
        return self.real.project_context(h)

    def context_kv(self, ctx, pos):
        return self.real.context_kv(ctx, pos)

    def propose(self, anchor, anchor_pos, ctx_k, ctx_v, ctx_valid, temperature, generator=None):
        p, B = int(anchor_pos[0]), self.block_size
        toks = [self.seq[i] if i < len(self.seq) else 0 for i in range(p + 1, p + 1 + B)]
        if self.calls % 2:
            toks[2] = (toks[2] + 1) % self.vocab
        self.calls += 1
        t = torch.tensor([toks])
        return Proposal(tokens=t, logits=torch.nn.functional.one_hot(t, self.vocab).float() * 30,
                        conf_logits=torch.zeros(1, B))


def test_greedy_losslessness_with_accepting_drafter(setup):
    _, model, tok, drafter = setup
    target = HFTarget("", [0, 1], model=model)
    prompt = render_prompt(tok, "count to ten")
    ref = autoregressive_generate(target, prompt, 30)
    oracle = OracleDrafter(drafter, prompt + ref, model.config.vocab_size)
    out = speculative_generate(target, oracle, prompt, 30, 0.0)
    assert out.tokens == ref
    taus = [r.tau for r in out.rounds]
    assert max(taus) == 5 and 3 in taus  # full blocks and corrupted-slot rounds both happened


def test_rejection_sampling_emits_the_target_distribution():
    p_logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    n = 2000
    drafts = torch.multinomial(q, n, replacement=True, generator=g)
    for d in drafts.tolist():
        a, bonus = verify_block(torch.tensor([d]), torch.log(q)[None], p_logits, 1.0, g)
        counts[d if a == 1 else bonus] += 1
    assert torch.allclose(counts / n, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.04)


def test_greedy_drafts_under_a_sampled_target_emit_the_target_distribution():
    """--draft-temperature 0: the draft is the drafter's argmax (a point mass), verified against p at T = 1."""
    p_logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))
    q_logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(4)
    n = 3000
    for _ in range(n):
        a, bonus = verify_block(torch.tensor([3]), q_logits, p_logits, 1.0, g, draft_temperature=0.0)
        counts[3 if a == 1 else bonus] += 1
    assert torch.allclose(counts / n, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)
    # treating the point mass as the sampled q (the default) would accept token 3 with p/q = 0.125 only
    wrong = torch.zeros(4)
    for _ in range(n):
        a, bonus = verify_block(torch.tensor([3]), q_logits, p_logits, 1.0, g)
        wrong[3 if a == 1 else bonus] += 1
    assert abs(float(wrong[3]) / n - 0.05) > 0.03 or abs(float(wrong[0]) / n - 0.5) > 0.03


def test_sampled_speculative_decoding_runs(setup):
    _, model, tok, drafter = setup
    target = HFTarget("", [0, 1], model=model)
    g = torch.Generator().manual_seed(3)
    out = speculative_generate(target, drafter, render_prompt(tok, "x y"), 16, 1.0, g)
    assert 1 <= len(out.tokens) <= 16 and all(1 <= r.tau <= 5 for r in out.rounds)


def test_fit_retrieval_prior_from_greedy_outputs_resumes_and_loads(setup, monkeypatch):
    """--fit-retrieval writes a prior the server's RetrievalConfidence loads; a resumed run fits the same table from
    the rounds log (it keeps each prompt's ids and output), and T > 0 is refused."""
    from sglang_dspark.retrieval import RetrievalConfidence

    root, *_ = setup
    out = root / "fitret" / "retrieval_confidence.json"
    argv = ["--target", str(root / "target"), "--drafter", str(root / "drafter"), "--dataset", str(root / "b.jsonl"),
            "--max-new-tokens", "24", "--temperature", "0", "--dtype", "fp32", "--fit-retrieval", str(out),
            "--json", str(root / "fitret" / "r.json")]
    report = eval_acceptance.main(argv)
    doc = json.loads(out.read_text())
    assert doc["fitted_on"]["sequences"] == report["fitted_retrieval"]["sequences"] == 3
    loaded = RetrievalConfidence.from_file(4, out)
    assert loaded.table["prompt"].shape[2] == 4
    calls = []
    monkeypatch.setattr(eval_acceptance, "speculative_generate", lambda *a, **k: calls.append(1))
    again = eval_acceptance.main(argv)
    assert calls == [] and json.loads(out.read_text())["table"] == doc["table"]
    assert again["fitted_retrieval"]["sequences"] == 3
    with pytest.raises(ValueError, match="greedy"):
        eval_acceptance.main([a if a != "0" else "1" for a in argv[:-2]] + ["--json", str(root / "fitret" / "t1.json")])
