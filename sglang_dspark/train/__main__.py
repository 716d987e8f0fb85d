"""python -m sglang_dspark.train {continue,generate,extra-text,capture,targets,fit,calibrate,draft-vocab} ... (each stage
resumable)."""

from __future__ import annotations

import argparse
import sys


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.train", description=__doc__)
    sub = p.add_subparsers(dest="stage", required=True)

    from . import generate  # the lead's stage (SGLang Engine); importing it is cheap, running it needs sglang

    generate.add_args(sub.add_parser("generate", help="regenerate assistant turns with the target (SGLang Engine)"))
    from . import accumulate, extra_text

    accumulate.add_args(sub.add_parser("continue", help="one more training round from the committed drafter on "
                                                        "fresh data within --budget-min (resumable)"))

    extra_text.add_args(sub.add_parser("extra-text", help="training prompts as distillation text (no generation)"))

    c = sub.add_parser("capture", help="conversations JSONL -> target feature cache")
    c.add_argument("--target", required=True, help="HF target model directory")
    c.add_argument("--data", required=True, action="append", help="JSONL of {id, messages}; repeatable")
    c.add_argument("--out", required=True, help="cache directory (resumes if it exists)")
    c.add_argument("--target-layer-ids", type=_ints, default=None, help="e.g. 1,9,17,25,33 (default: z-lab rule)")
    c.add_argument("--num-target-features", type=int, default=5, help="layers for the default rule")
    c.add_argument("--max-length", type=int, default=4096)
    c.add_argument("--min-loss-tokens", type=int, default=14)
    c.add_argument("--system-prompt", default="You are a helpful assistant.", help="'' to insert none")
    c.add_argument("--shard-samples", type=int, default=256)
    c.add_argument("--limit", type=int, default=0, help="capture at most N new samples (0 = all)")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    c.add_argument("--device", default=None)

    f = sub.add_parser("fit", help="train the drafter from a cache")
    f.add_argument("--cache", required=True)
    f.add_argument("--out", required=True, help="run directory (resumes from <out>/latest)")
    f.add_argument("--target", default=None, help="target dir (default: the one recorded in the cache)")
    f.add_argument("--layers", type=int, default=5)
    f.add_argument("--block-size", type=int, default=7)
    f.add_argument("--markov-rank", type=int, default=256, help="0 = DFlash ablation (no Markov head)")
    f.add_argument("--markov-head-type", default="vanilla", choices=["vanilla", "gated", "rnn"])
    f.add_argument("--intermediate-size", type=int, default=None, help="default: the target's")
    f.add_argument("--no-confidence-head", action="store_true")
    f.add_argument("--mask-token-id", type=int, default=None)
    f.add_argument("--num-anchors", type=int, default=512)
    f.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    f.add_argument("--max-minutes", type=float, default=0.0,
                   help="stop (with a checkpoint) after this many minutes of this process, even before --steps; "
                        "0 = no limit")
    f.add_argument("--batch", type=int, default=8, help="sequences per optimizer step (accumulated)")
    f.add_argument("--lr", type=float, default=6e-4)
    f.add_argument("--warmup-ratio", type=float, default=0.04)
    f.add_argument("--weight-decay", type=float, default=0.0)
    f.add_argument("--grad-clip", type=float, default=1.0)
    f.add_argument("--ce-weight", type=float, default=0.1)
    f.add_argument("--ce-labels", default="text", choices=["text", "target"],
                   help="CE against the text's next token, or against the target's argmax there (what greedy "
                        "verification accepts; lets text the target did not write teach the server's drafts)")
    f.add_argument("--l1-weight", type=float, default=0.9)
    f.add_argument("--conf-weight", type=float, default=1.0)
    f.add_argument("--gamma", type=float, default=4.0, help="loss decay exp(-k/gamma)")
    f.add_argument("--max-length", type=int, default=4096)
    f.add_argument("--vocab-sample-top-k", type=int, default=0,
                   help="sampled vocabulary: logits only over each position's target top-k + labels + negatives "
                        "(0 = full vocabulary)")
    f.add_argument("--vocab-sample-negatives", type=int, default=4096, help="random token ids per sampled step")
    f.add_argument("--holdout-fraction", type=float, default=0.02)
    f.add_argument("--save-every", type=int, default=500)
    f.add_argument("--keep-checkpoints", type=int, default=3)
    f.add_argument("--no-save-shared", action="store_true", help="omit embed_tokens/lm_head from checkpoints")
    f.add_argument("--save-dtype", default="bf16", choices=["bf16", "fp32"])
    f.add_argument("--amp", default="auto", choices=["auto", "bf16", "none"],
                   help="bf16 autocast: auto = on CUDA and on CPUs with a native bf16 dot product (AVX512-BF16 or "
                        "AMX), where it is several times faster than fp32; none = fp32 everywhere")
    f.add_argument("--log-every", type=int, default=10)
    f.add_argument("--seed", type=int, default=42)
    f.add_argument("--no-resume", action="store_true")
    f.add_argument("--init-from", default=None,
                   help="start from this checkpoint's weights with a fresh optimizer and schedule (ignored when "
                        "<out> already has a checkpoint to resume)")
    f.add_argument("--eval-every", type=int, default=0,
                   help="every N steps (and before the first), held-out greedy acceptance (tau, first-draft "
                        "acceptance) into train_log.jsonl; 0 = never")
    f.add_argument("--eval-samples", type=int, default=16, help="held-out sequences per evaluation")
    f.add_argument("--eval-anchors", type=int, default=64, help="blocks per held-out sequence")
    f.add_argument("--init-from-target", action="store_true",
                   help="warm start: draft layers = the target's last --layers layers, fc = identity on the last "
                        "feature (which must be the layer just below them), Markov W2 and confidence head zero")
    f.add_argument("--init-channel-samples", type=int, default=16,
                   help="training sequences that rank MLP channels when --intermediate-size is below the target's")
    f.add_argument("--device", default=None)

    from . import vocab

    t = sub.add_parser("targets", help="per-position target top-k ids and log-sum-exp next to a cache (fit reads "
                                       "them instead of running the full lm_head every step)")
    t.add_argument("--cache", required=True)
    t.add_argument("--target", default=None, help="default: the one recorded in the cache")
    t.add_argument("--top-k", type=int, default=64)

    vocab.add_args(sub.add_parser("draft-vocab", help="reduced draft vocabulary from the assistant turns' tokens"))

    k = sub.add_parser("calibrate", help="fit STS on the held-out split; writes sts.json next to the drafter")
    k.add_argument("--cache", required=True)
    k.add_argument("--drafter", required=True, help="checkpoint dir (e.g. <run>/step_N)")
    k.add_argument("--target", default=None)
    k.add_argument("--no-target-weights", action="store_true", help="drafter stores embed/lm_head itself")
    k.add_argument("--out", default=None, help="default: <drafter>/sts.json")
    k.add_argument("--holdout-fraction", type=float, default=0.02)
    k.add_argument("--max-samples", type=int, default=0)
    k.add_argument("--num-anchors", type=int, default=64)
    k.add_argument("--max-length", type=int, default=4096)
    k.add_argument("--temperature", type=float, default=1.0, help="0 = greedy acceptance labels")
    k.add_argument("--regime", choices=["greedy", "sampled"], default=None,
                   help="which temperature set of sts.json to write (default: greedy at --temperature 0, else "
                        "sampled: used for requests served at T > 0)")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--device", default=None)
    return p


def extra_text_run(args):
    from .extra_text import run

    return run(args)


def main(argv: list[str] | None = None):
    args = build_parser().parse_args(argv)
    if args.stage == "extra-text":
        return extra_text_run(args)
    if args.stage == "continue":
        from .accumulate import run
        return run(args)
    if args.stage == "generate":
        from .generate import run
        return run(args)
    if args.stage == "draft-vocab":
        from .vocab import run
        return run(args)
    if args.stage == "capture":
        from .capture import run_capture
        return run_capture(args)
    if args.stage == "targets":
        from .target_stats import run_targets_cli
        return run_targets_cli(args)
    if args.stage == "fit":
        from .fit import run_fit
        return run_fit(args)
    from .calibrate import run_calibrate
    return run_calibrate(args)


if __name__ == "__main__":
    main(sys.argv[1:])
