"""Offline acceptance eval: HF target + DSpark drafter, batch 1, full-block verification (reference §3).

python -m sglang_dspark.eval_acceptance [--target DIR] [--drafter DIR] [--dataset X.jsonl ...] [--limit N]
    [--max-new-tokens M] [--temperature T] [--seed S] [--json OUT] [--plots DIR]
    [--exclude-prompts DATA.jsonl ...] [--fit-sts STS.json] [--fit-retrieval retrieval_confidence.json]

Reports tau (bonus included), conditional acceptance and survival by position, and ECE / AUC of the predicted
prefix survival, raw and after STS (temperatures from <drafter>/sts.json or --sts).

--fit-sts fits STS on the rounds of this very run (free-running decoding, the way the server drafts) and writes the
temperatures of this run's regime (greedy at T = 0, sampled at T > 0) into STS.json. Run it on prompts the drafter
was not trained on (--exclude-prompts runs/data/generated.jsonl) and never on the eval sets it is scored on.
--fit-retrieval (T = 0 only) fits the retrieval drafts' confidence prior (retrieval/confidence.py, fit_table) on this
run's greedy outputs: at every output position, the prompt-lookup chain a T = 0 server would verify and how far it
matches the real continuation. The server reads it as <drafter>/retrieval_confidence.json and refines it online.
Finished prompts are appended to <json>.rounds.jsonl (or --rounds), so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch
from tqdm import tqdm

from .drafter import fit_sts, fit_sts_affine, load_drafter, load_sts, load_sts_biases, save_sts
from .drafter.sts import survival_ece
from .eval.datasets import dataset_name, default_datasets, load_prompts, used_prompts
from .eval.report import acceptance_stats, calibration_stats, stack_rounds, write_plots
from .eval.spec_decode import Round, speculative_generate
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
    p.add_argument("--draft-temperature", type=float, default=None,
                   help="sample drafts at this temperature instead of --temperature (0: greedy drafts); "
                        "verification stays lossless against the target at --temperature")
    p.add_argument("--seed", type=int, default=980406, help="prompt i uses seed + i")
    p.add_argument("--sts", default=None, help="sts.json (default: the drafter's, if present)")
    p.add_argument("--dtype", default="bf16", choices=sorted(_DTYPES))
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--plots", default=None, help="write acceptance.png and reliability.png here")
    p.add_argument("--exclude-prompts", action="append", default=[], metavar="JSONL",
                   help="skip prompts that appear in this training data or prompt set (repeatable)")
    p.add_argument("--fit-sts", default=None, metavar="STS_JSON",
                   help="fit STS on this run's rounds and write this regime's temperatures there")
    p.add_argument("--sts-form", choices=["affine", "temperature"], default="affine",
                   help="--fit-sts: sigmoid(z/T + b) per position (default) or the paper's temperature only")
    p.add_argument("--fit-retrieval", default=None, metavar="JSON",
                   help="T = 0: fit the retrieval-draft confidence prior on this run's outputs and write it there")
    p.add_argument("--rounds", default=None, help="per-prompt rounds log for resuming (default: <json>.rounds.jsonl)")
    return p


class RoundsLog:
    """Finished prompts' rounds, one JSON line each, keyed by everything that changes them."""

    def __init__(self, path: str | None, settings: dict):
        self.path = path
        self.key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        self.done: dict[tuple[str, int], list[Round]] = {}
        self.sequences: dict[tuple[str, int], tuple[list[int], list[int]]] = {}  # (prompt ids, output ids)
        if path and os.path.exists(path):
            with open(path) as f:
                for line in f:
                    row = json.loads(line) if line.strip() else None
                    if row and row["key"] == self.key:
                        self.done[(row["dataset"], row["index"])] = [
                            Round(n, a, t, torch.tensor(z)) for n, a, t, z in row["rounds"]]
                        if "prompt_ids" in row:
                            self.sequences[(row["dataset"], row["index"])] = (row["prompt_ids"], row["output_ids"])

    def add(self, dataset: str, index: int, rounds: list[Round], prompt_ids=None, output_ids=None) -> None:
        if prompt_ids is not None:
            self.sequences[(dataset, index)] = (list(prompt_ids), list(output_ids))
        if not self.path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": self.key, "dataset": dataset, "index": index, "rounds": [
                [r.proposed, r.accepted, r.tau, r.conf_logits.float().tolist()] for r in rounds],
                **({} if prompt_ids is None else {"prompt_ids": list(prompt_ids),
                                                  "output_ids": list(output_ids)})}) + "\n")


def run(args) -> dict:
    from transformers import AutoTokenizer

    if args.fit_retrieval and args.temperature > 0:
        raise ValueError("--fit-retrieval: fitted from greedy outputs only (--temperature 0)")

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
        temps, biases = load_sts(args.sts, regime), load_sts_biases(args.sts, regime)
    elif regime == "sampled":
        temps, biases = drafter.sts_temperatures_sampled, drafter.sts_biases_sampled
    else:
        temps, biases = drafter.sts_temperatures, drafter.sts_biases
    B = drafter.block_size
    if regime == "sampled":
        _warn_draft_temperature_mismatch(args.sts or os.path.join(args.drafter, "sts.json"), args.draft_temperature)

    exclude = set()
    for path in args.exclude_prompts:
        exclude |= used_prompts(path)
    log = RoundsLog(args.rounds or (args.json + ".rounds.jsonl" if args.json else None), {
        "target": os.path.abspath(args.target), "drafter": os.path.abspath(args.drafter), "dtype": args.dtype,
        "temperature": args.temperature, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
        **({} if args.draft_temperature is None else {"draft_temperature": args.draft_temperature}),
        "full_draft_vocab": bool(getattr(args, "full_draft_vocab", False)), "limit": args.limit,
        "exclude": sorted(os.path.abspath(p) for p in args.exclude_prompts)})

    per_dataset, all_rounds = {}, []
    for path in args.dataset or default_datasets():
        name = dataset_name(path)
        rounds = []
        for i, turn in enumerate(tqdm(load_prompts(path, args.limit, exclude), desc=name, unit="prompt")):
            if (name, i) in log.done:
                rounds += log.done[(name, i)]
                continue
            gen = torch.Generator(device=device).manual_seed(args.seed + i)
            prompt_ids = render_prompt(tokenizer, turn)
            out = speculative_generate(target, drafter, prompt_ids, args.max_new_tokens,
                                       args.temperature, gen, stop_ids, args.draft_temperature)
            log.add(name, i, out.rounds, prompt_ids, out.tokens)
            rounds += out.rounds
        per_dataset[name] = {**acceptance_stats(rounds, B),
                             **{k: v for k, v in calibration_stats(rounds, B, temps, biases).items()
                                if not k.startswith("_")}}
        all_rounds += rounds

    pooled = acceptance_stats(all_rounds, B)
    calib = calibration_stats(all_rounds, B, temps, biases)
    report = {
        "tau": pooled["tau"], "tau_by_dataset": {k: v["tau"] for k, v in per_dataset.items()},
        "cond_accept_by_position": pooled["cond_accept_by_position"],
        "survival_by_position": pooled["survival_by_position"], "rounds": pooled["rounds"],
        **{k: v for k, v in calib.items() if not k.startswith("_")},
        "sts_temperatures": temps, "sts_biases": biases, "per_dataset": per_dataset,
        "settings": {"target": args.target, "drafter": args.drafter, "temperature": args.temperature,
                     "draft_temperature": args.draft_temperature,
                     "max_new_tokens": args.max_new_tokens, "limit": args.limit, "seed": args.seed,
                     "block_size": B, "dtype": args.dtype,
                     "verification": "full block every round (scheduler off), batch 1"},
    }
    if args.fit_sts:
        report["fitted_sts"] = fit_sts_from_rounds(all_rounds, B, args, regime)
    if args.fit_retrieval:
        report["fitted_retrieval"] = fit_retrieval_prior(list(log.sequences.values()), B, args)
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


def _warn_draft_temperature_mismatch(sts_path: str, draft_temperature: float | None) -> None:
    """The sampled STS set describes acceptance of drafts drawn at one draft temperature; scoring it on drafts drawn
    at another measures a different rule's calibration."""
    if not os.path.exists(sts_path):
        return
    with open(sts_path) as f:
        fitted = json.load(f).get("sampled", {}).get("draft_temperature")
    if fitted != draft_temperature:
        def say(t):
            return "the target's temperature" if t is None else f"T={t}"
        print(f"[eval] note: {sts_path}'s sampled STS set was fitted on drafts at {say(fitted)}; this run drafts at "
              f"{say(draft_temperature)}, so its ece_sts is not that set's calibration")


def fit_sts_from_rounds(rounds: list[Round], B: int, args, regime: str) -> dict:
    if not rounds:
        raise ValueError("--fit-sts: no speculative rounds to fit on")
    conf, acc, ver = stack_rounds(rounds, B)
    if args.sts_form == "affine":
        temps, biases = fit_sts_affine(conf, acc, ver)
    else:
        temps, biases = fit_sts(conf, acc, ver), None
    full = ver == B
    meta = {"block_size": B, "num_blocks": len(rounds),
            "labels": f"free-running speculative decoding (batch 1, full block verified every round, "
                      f"{args.max_new_tokens} new tokens per prompt)",
            "acceptance": "greedy" if regime == "greedy" else f"rejection-sampling T={args.temperature}",
            **({} if args.draft_temperature is None else {"draft_temperature": args.draft_temperature}),
            "prompts": [dataset_name(p) for p in args.dataset or default_datasets()], "limit": args.limit,
            "heldout_tau": 1.0 + float(acc[full].float().mean()) if bool(full.any()) else None,
            "form": args.sts_form,
            "ece_raw": survival_ece(conf, acc, ver), "ece_sts": survival_ece(conf, acc, ver, temps, biases=biases)}
    save_sts(args.fit_sts, temps, meta, regime=regime, biases=biases)
    print(f"[eval] fitted STS ({regime}) on {len(rounds)} rounds: in-sample ECE {meta['ece_raw']:.4f} -> "
          f"{meta['ece_sts']:.4f}; T = {[round(t, 3) for t in temps]} b = {biases} -> {args.fit_sts}")
    return {"path": args.fit_sts, "regime": regime, "temperatures": temps, "biases": biases, **meta}


def fit_retrieval_prior(sequences, B: int, args) -> dict:
    from .retrieval.confidence import fit_table

    if not sequences:
        raise ValueError("--fit-retrieval: no outputs to fit on")
    conf = fit_table(sequences, B)
    os.makedirs(os.path.dirname(os.path.abspath(args.fit_retrieval)), exist_ok=True)
    with open(args.fit_retrieval, "w") as f:
        json.dump({**conf.to_json(), "fitted_on": {"sequences": len(sequences), "max_new_tokens": args.max_new_tokens,
                                                   "prompts": [dataset_name(p) for p in args.dataset or
                                                               default_datasets()]}}, f)
    ece = conf.ece("prompt")
    print(f"[eval] fitted retrieval prior on {len(sequences)} outputs (in-sample ECE by position "
          f"{[round(e, 4) for e in ece]}) -> {args.fit_retrieval}")
    return {"path": args.fit_retrieval, "sequences": len(sequences), "ece_in_sample": ece}


def main(argv: list[str] | None = None) -> dict:
    from .embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR

    args = build_parser().parse_args(argv)
    args.target = args.target or str(DEFAULT_TARGET_DIR)
    args.drafter = args.drafter or str(DEFAULT_DRAFTER_DIR)
    return run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
