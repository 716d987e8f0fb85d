"""Offline acceptance eval: HF target + DSpark drafter, batch 1, full-block verification (reference §3).

python -m sglang_dspark.eval_acceptance [--target DIR] [--drafter DIR] [--dataset X.jsonl ...] [--limit N]
    [--max-new-tokens M] [--temperature T] [--seed S] [--json OUT] [--plots DIR]

Reports tau (bonus included), conditional acceptance and survival by position, and ECE / AUC of the predicted
prefix survival, raw and after STS (temperatures from <drafter>/sts.json or --sts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from tqdm import tqdm

from .drafter import load_drafter, load_sts
from .eval.datasets import dataset_name, default_datasets, load_prompts
from .eval.report import acceptance_stats, calibration_stats, write_plots
from .eval.spec_decode import speculative_generate
from .train.chat import render_prompt
from .train.target import HFTarget

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.eval_acceptance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="HF target directory (default: the embedded model)")
    p.add_argument("--drafter", default=None, help="drafter checkpoint directory (default: the shipped drafter)")
    p.add_argument("--full-draft-vocab", action="store_true",
                   help="ignore the drafter's draft_vocab.safetensors (propose over the whole vocabulary)")
    p.add_argument("--dataset", action="append", default=None, help="JSONL of {turns}; repeatable "
                   "(default: gsm8k, humaneval, mt-bench under $SGLANG_DSPARK_DATA or ../shared/data)")
    p.add_argument("--limit", type=int, default=0, help="prompts per dataset (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=2048)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=980406, help="prompt i uses seed + i")
    p.add_argument("--sts", default=None, help="sts.json (default: the drafter's, if present)")
    p.add_argument("--dtype", default="bf16", choices=sorted(_DTYPES))
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--plots", default=None, help="write acceptance.png and reliability.png here")
    return p


def run(args) -> dict:
    from transformers import AutoTokenizer

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = _DTYPES[args.dtype]
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype)
    drafter = load_drafter(args.drafter, hf.get_input_embeddings().weight.detach(),
                           hf.get_output_embeddings().weight.detach(), dtype=dtype, device=device,
                           draft_vocab=not getattr(args, "full_draft_vocab", False))
    target = HFTarget(args.target, drafter.config.target_layer_ids, model=hf, device=device)
    stop_ids = target.stop_token_ids(tokenizer)
    regime = "greedy" if args.temperature <= 0 else "sampled"  # drafter/sts.py: calibrated per acceptance rule
    if args.sts:
        temps = load_sts(args.sts, regime)
    else:
        temps = drafter.sts_temperatures_sampled if regime == "sampled" else drafter.sts_temperatures
    B = drafter.block_size

    per_dataset, all_rounds = {}, []
    for path in args.dataset or default_datasets():
        name = dataset_name(path)
        rounds = []
        for i, turn in enumerate(tqdm(load_prompts(path, args.limit), desc=name, unit="prompt")):
            gen = torch.Generator(device=device).manual_seed(args.seed + i)
            out = speculative_generate(target, drafter, render_prompt(tokenizer, turn), args.max_new_tokens,
                                       args.temperature, gen, stop_ids)
            rounds += out.rounds
        per_dataset[name] = {**acceptance_stats(rounds, B),
                             **{k: v for k, v in calibration_stats(rounds, B, temps).items()
                                if not k.startswith("_")}}
        all_rounds += rounds

    pooled = acceptance_stats(all_rounds, B)
    calib = calibration_stats(all_rounds, B, temps)
    report = {
        "tau": pooled["tau"], "tau_by_dataset": {k: v["tau"] for k, v in per_dataset.items()},
        "cond_accept_by_position": pooled["cond_accept_by_position"],
        "survival_by_position": pooled["survival_by_position"], "rounds": pooled["rounds"],
        **{k: v for k, v in calib.items() if not k.startswith("_")},
        "sts_temperatures": temps, "per_dataset": per_dataset,
        "settings": {"target": args.target, "drafter": args.drafter, "temperature": args.temperature,
                     "max_new_tokens": args.max_new_tokens, "limit": args.limit, "seed": args.seed,
                     "block_size": B, "dtype": args.dtype,
                     "verification": "full block every round (scheduler off), batch 1"},
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if args.plots:
        points = {n: calib[f"_surv_{n}"] for n in ("raw", "sts") if f"_surv_{n}" in calib}
        report["plots"] = write_plots(report, points, args.plots)
    tau = "n/a" if report["tau"] is None else f"{report['tau']:.3f}"
    print(f"[eval] tau={tau} by dataset {report['tau_by_dataset']} ece_raw={report['ece_raw']} "
          f"ece_sts={report['ece_sts']} auc={report['auc']}")
    return report


def main(argv: list[str] | None = None) -> dict:
    from .embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR

    args = build_parser().parse_args(argv)
    args.target = args.target or str(DEFAULT_TARGET_DIR)
    args.drafter = args.drafter or str(DEFAULT_DRAFTER_DIR)
    return run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
