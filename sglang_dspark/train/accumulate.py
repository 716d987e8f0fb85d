"""`train continue --budget-min N`: one more round of training on fresh data, inside a time budget.

Feature caches are large and do not travel between machines; the drafter (a few tens of MB) and two small files
next to it do: `training/cursor.json` (how far into the training pool earlier rounds have read: the interleaved
prompt files, then the procedural prompts of train/procedural.py) and
`training/curve.jsonl` (one row per round: blocks and CPU-hours so far, tau, ECE, shipped or not). A round:

  data      the next prompts after the cursor, as text (`--data-mode text`, cheap) or regenerated greedily by the
            target (`generate`, ~5x the CPU per token)
  capture   target features for them (the drafter's feature layers), then the target's top-k statistics
  fit       from the current drafter's weights, a fresh cosine schedule sized to the fit share of the budget
  calibrate STS fitted on free-running speculative decoding (`eval_acceptance --fit-sts`, as the server drafts) of
            `--sts-prompts` prompts: by default a dev slice of the eval sets that eval never measures
            (`--sts-set eval-dev`), else the training prompts after the round's (`pool`); greedy and sampled sets,
            into the candidate's sts.json (teacher-forced fits left 4-6% ECE at position 1)
  eval      `eval_acceptance` (T = 0, gamma = the block size) on the eval prompt sets, the same prompts every round
  ship      only if its tau beats the shipped drafter's last recorded tau and the worst position's ECE stays <= 3%

Taus are compared only between rows measured the same way (dtype, prompts per dataset, tokens: the row's "eval"):
when the curve holds no shipped row with this round's settings, the baseline stage measures the drafter in place.

Every stage records its completion in <work>/state.json, so an interrupted round resumes at the stage it was in.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from datetime import date
from pathlib import Path

from ..bench.machine import describe_machine

SHARES = {"data": 0.30, "fit": 0.45}  # of the budget; capture statistics, calibration and eval take the rest
FIT_BATCH = 2  # sequences per optimizer step
STS_PROMPTS = 24  # ~1,000 free-running rounds at 64 tokens: enough for 7 positions x (temperature, bias)
MAX_EPOCHS = 4  # passes over a round's fresh samples; more fits the round's few hundred samples, not the target
ECE_LIMIT = 0.03
DEFAULT_STEP_SECONDS = 4.0  # one 2-sequence, 128-anchor step on a 2-core EPYC Zen 3 (2026-12-02)
# capture + target statistics per prompt of dataset text (~360 tokens at 55-100 tok/s), and generation on top
DEFAULT_PROMPT_SECONDS = {"text": 5.0, "generate": 40.0}


def add_args(p: argparse.ArgumentParser) -> None:
    from ..embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR

    p.add_argument("--budget-min", type=float, required=True, help="wall-clock minutes for the whole round")
    p.add_argument("--drafter", default=str(DEFAULT_DRAFTER_DIR), help="the committed drafter to continue from")
    p.add_argument("--target", default=str(DEFAULT_TARGET_DIR))
    p.add_argument("--work", default="runs/continue", help="caches and checkpoints of the round (not committed)")
    p.add_argument("--data-mode", choices=["text", "generate"], default="text")
    p.add_argument("--prompts", type=int, default=0, help="prompts this round (0 = as many as the data share fits)")
    p.add_argument("--eval-limit", type=int, default=20, help="eval prompts per dataset")
    p.add_argument("--eval-tokens", type=int, default=64)
    p.add_argument("--fit-args", default="", help="extra `train fit` flags, e.g. '--lr 3e-4'")
    p.add_argument("--no-ship", action="store_true", help="evaluate and record, never replace the drafter")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"],
                   help="target dtype for data, capture and eval. auto: bf16 on CUDA and on CPUs with a native bf16 "
                        "dot product (AMX: capture 3.5x faster than fp32), fp32 elsewhere (~4x faster than bf16 "
                        "on AVX2-only CPUs)")
    p.add_argument("--sts-prompts", type=int, default=STS_PROMPTS,
                   help="prompts the candidate's STS is fitted on (per regime), see --sts-set")
    p.add_argument("--sts-set", choices=["eval-dev", "pool"], default="eval-dev",
                   help="what the STS is fitted on: a dev slice of the eval sets disjoint from the measured prompts "
                        "(default), or the unseen training-pool prompts after the round's")
    p.add_argument("--max-epochs", type=float, default=MAX_EPOCHS,
                   help="cap on the fit's passes over the round's training samples")


def sts_prompt_turns(args, cursor: int) -> list[str]:
    """The prompts a candidate's STS is fitted on. `eval-dev`: a dev slice of each eval set, disjoint from the
    prompts τ and ECE are measured on (eval/datasets.py calibration_prompts). `pool`: the training prompts after
    the round's, unseen by every round so far; since the cursor passed the prompt files these are procedural, on
    which the drafter is surer than on the eval sets (an STS fitted there left position 1 at 9-10% ECE on them,
    the raw head at 2.9%)."""
    if args.sts_set == "eval-dev":
        from ..eval.datasets import calibration_prompts, default_datasets

        paths = default_datasets()
        per = math.ceil(args.sts_prompts / len(paths))
        sets = [calibration_prompts(p, per, args.eval_limit) for p in paths]
        return [t for group in zip(*sets) for t in group][: args.sts_prompts]
    from .generate import TRAIN_POOL, _load_prompt_rows

    rows = _load_prompt_rows(TRAIN_POOL)
    return [rows[(cursor + i) % len(rows)][2] for i in range(min(args.sts_prompts, len(rows)))]


def training_dir(drafter: str) -> Path:
    return Path(drafter) / "training"


def read_cursor(drafter: str) -> dict:
    path = training_dir(drafter) / "cursor.json"
    return json.loads(path.read_text()) if path.exists() else {"next": 0}


def read_curve(drafter: str) -> list[dict]:
    path = training_dir(drafter) / "curve.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def resolve_dtype(dtype: str) -> str:
    if dtype != "auto":
        return dtype
    import torch

    from .fit import use_autocast

    return "bf16" if use_autocast("auto", "cuda" if torch.cuda.is_available() else "cpu") else "fp32"


def eval_settings(args: argparse.Namespace) -> dict:
    return {"dtype": resolve_dtype(args.dtype), "limit": args.eval_limit, "tokens": args.eval_tokens}


def shipped_tau(curve: list[dict], settings: dict | None = None) -> float | None:
    """The last shipped row's tau; with `settings`, of the last shipped row measured with those settings."""
    shipped = [r for r in curve if r.get("shipped") and (settings is None or r.get("eval") == settings)]
    return shipped[-1]["tau"] if shipped else None


def should_ship(tau: float, worst_ece: float | None, curve: list[dict],
                settings: dict | None = None) -> tuple[bool, str]:
    best = shipped_tau(curve, settings)
    if worst_ece is None or worst_ece > ECE_LIMIT:
        return False, f"worst position ECE {worst_ece} above {ECE_LIMIT}"
    if best is not None and tau <= best:
        return False, f"tau {tau:.3f} does not beat the shipped {best:.3f}"
    return True, f"tau {tau:.3f} (shipped before: {best})"


def worst_position_ece(report: dict) -> float | None:
    """The largest per-position ECE after STS, counting a position at its noise floor (the ECE a perfectly
    calibrated predictor shows on as few rounds) as passing: late positions see few rounds."""
    eces = report.get("ece_sts_by_position") or []
    floors = report.get("ece_sts_floor_by_position") or [None] * len(eces)
    worst = None
    for e, fl in zip(eces, floors):
        if e is None:
            continue
        e = 0.0 if fl is not None and e <= fl else e
        worst = e if worst is None else max(worst, e)
    return worst


def holdout_fraction_for(cache_path: str) -> float:
    """The smallest of 10-50% that leaves both splits non-empty (the split hashes sample ids)."""
    from .cache import CacheReader

    cache = CacheReader(cache_path)
    for frac in (0.1, 0.2, 0.3, 0.5):
        train, held = cache.split(frac)
        if train and held:
            return frac
    raise ValueError(f"{cache_path}: {len(cache)} samples cannot be split into training and held-out ones")


def step_seconds(curve: list[dict]) -> float:
    rates = [r["fit_seconds"] / r["fit_steps"] for r in curve if r.get("fit_steps")]
    return rates[-1] if rates else DEFAULT_STEP_SECONDS


def prompt_seconds(curve: list[dict], mode: str) -> float:
    """Data + capture seconds per prompt, as the last round of this data mode measured them."""
    rates = [r["data_seconds"] / r["prompts"] for r in curve
             if r.get("data_mode") == mode and r.get("prompts") and r.get("data_seconds")]
    return rates[-1] if rates else DEFAULT_PROMPT_SECONDS[mode]


class Round:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.state_path = self.work / "state.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
        if not self.state:
            self.state = {"started": time.time(), "cursor": read_cursor(args.drafter)["next"], "done": []}
            self.save()

    def save(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        os.replace(tmp, self.state_path)

    def left_s(self) -> float:
        return self.args.budget_min * 60 - (time.time() - self.state["started"])

    def stage(self, name: str, fn) -> None:
        if name in self.state["done"]:
            print(f"[continue] {name}: done before, skipped")
            return
        t0 = time.time()
        print(f"[continue] {name} ({self.left_s() / 60:.1f} min of the budget left)")
        out = fn() or {}
        self.state.setdefault("results", {})[name] = {**out, "seconds": time.time() - t0}
        self.state["done"].append(name)
        self.save()


def run(args: argparse.Namespace) -> dict:
    from ..drafter import DSparkConfig
    from .__main__ import main as train_main
    from .extra_text import write_text_conversations
    from .generate import TRAIN_POOL, _load_prompt_rows

    r = Round(args)
    if "eval" not in r.state:  # the round keeps the settings it started with
        r.state["eval"] = eval_settings(args)
        r.save()
    settings = r.state["eval"]
    dtype = settings["dtype"]
    cfg = DSparkConfig.from_json(args.drafter)
    data = r.work / "data.jsonl"
    cache = r.work / "cache"
    budget_s = args.budget_min * 60

    def holdout() -> float:
        return r.state["results"]["capture"]["holdout_fraction"]

    def data_stage():
        rows = _load_prompt_rows(TRAIN_POOL)
        per_prompt_s = prompt_seconds(read_curve(args.drafter), args.data_mode)
        n = min(len(rows), args.prompts or max(8, int(SHARES["data"] * budget_s / per_prompt_s)))
        start = r.state["cursor"] % len(rows)
        take = rows[start: start + n]  # the last round before the wrap takes what is left
        if args.data_mode == "generate":
            train_main(["generate", "--target", args.target, "--out", str(data), "--sources", *TRAIN_POOL,
                        "--offset", str(start),
                        "--limit", str(len(take)), "--temperature", "0", "--max-new-tokens", "256", "--batch", "32",
                        "--dtype", "float32" if dtype == "fp32" else "bfloat16"])
        else:
            write_text_conversations(take, data)
        return {"prompts": len(take), "cursor_from": r.state["cursor"], "cursor_to": r.state["cursor"] + len(take)}

    def capture_stage():
        train_main(["capture", "--target", args.target, "--data", str(data), "--out", str(cache),
                    "--target-layer-ids", ",".join(map(str, cfg.target_layer_ids)), "--max-length", "1024",
                    "--system-prompt", "", "--dtype", dtype])
        train_main(["targets", "--cache", str(cache), "--top-k", "64"])
        return {"holdout_fraction": holdout_fraction_for(str(cache))}

    def fit_stage():
        curve = read_curve(args.drafter)
        if "fit_steps_planned" not in r.state:  # a resumed fit keeps the schedule it started with
            fit_s = max(60.0, min(SHARES["fit"] * budget_s, r.left_s() - 0.25 * budget_s))
            from .cache import CacheReader

            n_train = len(CacheReader(str(cache)).split(holdout())[0])
            r.state["fit_steps_planned"] = max(10, min(int(fit_s / step_seconds(curve)),
                                                       math.ceil(args.max_epochs * n_train / FIT_BATCH)))
            r.save()
        steps = r.state["fit_steps_planned"]
        # a slower step than the last round's stops the fit (checkpointed) before it eats the eval's share
        max_min = max(1.0, (r.left_s() - 0.2 * budget_s) / 60)
        t0 = time.time()
        res = train_main(["fit", "--cache", str(cache), "--out", str(r.work / "fit"), "--init-from", args.drafter,
                    "--steps", str(steps), "--batch", str(FIT_BATCH), "--num-anchors", str(cfg.num_anchors),
                    "--lr", "3e-4", "--warmup-ratio", "0.02", "--ce-weight", "1.0", "--l1-weight", "0.1",
                    "--ce-labels", "target", "--vocab-sample-top-k", "32", "--vocab-sample-negatives", "4096",
                    "--holdout-fraction", str(holdout()), "--save-every", "50", "--keep-checkpoints", "1",
                    "--no-save-shared", "--save-dtype", "bf16", "--eval-every", "100", "--eval-samples", "8",
                    "--max-minutes", f"{max_min:.1f}", *args.fit_args.split()])
        return {"fit_steps": res["final_step"], "fit_seconds": time.time() - t0}

    def calibrate_stage():
        from ..eval_acceptance import main as eval_main
        from .fit import latest_checkpoint

        ckpt = latest_checkpoint(str(r.work / "fit"))
        cand = r.work / "candidate"
        shutil.rmtree(cand, ignore_errors=True)
        shutil.copytree(ckpt, cand, ignore=shutil.ignore_patterns("training_state.pt", "sts.json"))
        for name in ("draft_vocab.safetensors", "retrieval_confidence.json"):
            if (Path(args.drafter) / name).exists():
                shutil.copy(Path(args.drafter) / name, cand / name)
        prompts = r.work / "sts_prompts.jsonl"
        turns = sts_prompt_turns(args, r.state["results"]["data"]["cursor_to"])
        with open(prompts, "w") as f:
            for turn in turns:
                f.write(json.dumps({"turns": [turn]}) + "\n")
        fitted = {}
        for t in ("0", "1"):  # greedy set, then the sampled set with greedy drafts (the served default at T > 0)
            rep = eval_main(["--target", args.target, "--drafter", str(cand), "--dataset", str(prompts),
                             "--max-new-tokens", str(args.eval_tokens), "--temperature", t, "--draft-temperature",
                             "0", "--dtype", dtype, "--fit-sts", str(cand / "sts.json"),
                             "--json", str(r.work / f"sts_T{t}.json")])
            fitted[t] = rep["fitted_sts"].get("ece_sts")
        return {"candidate": str(cand), "sts_prompts": len(turns), "sts_set": args.sts_set, "sts_fit_ece": fitted}

    def evaluate(drafter: str, name: str) -> dict:
        from ..eval_acceptance import main as eval_main

        rep = eval_main(["--target", args.target, "--drafter", drafter, "--limit",
                         str(args.eval_limit), "--max-new-tokens", str(args.eval_tokens), "--temperature", "0",
                         "--dtype", dtype, "--json", str(r.work / f"{name}_T0.json")])
        return {"tau": rep["tau"], "tau_by_dataset": rep["tau_by_dataset"], "ece_sts": rep.get("ece_sts"),
                "worst_ece": worst_position_ece(rep), "ece_by_position": rep.get("ece_sts_by_position"),
                "ece_floor_by_position": rep.get("ece_sts_floor_by_position")}

    def baseline_stage():
        """The first round measures the drafter in place on the same prompts, so the first candidate must beat it."""
        if shipped_tau(read_curve(args.drafter), settings) is not None:
            return {"skipped": True}
        return evaluate(args.drafter, "baseline")

    def eval_stage():
        return evaluate(str(r.work / "candidate"), "eval")

    def ship_stage():
        res = r.state["results"]
        tdir = training_dir(args.drafter)
        tdir.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in res["baseline"].items() if k != "seconds"}
        if not base.get("skipped"):
            prior = read_curve(args.drafter)
            before = prior[-1] if prior else {"blocks": 0, "cpu_hours": 0.0}
            with open(tdir / "curve.jsonl", "a") as f:  # blocks and CPU-hours count from the first round on
                f.write(json.dumps({"date": date.today().isoformat(), "cpu": describe_machine(), "baseline": True,
                                    "blocks": before["blocks"], "cpu_hours": before["cpu_hours"], **base,
                                    "eval": settings, "shipped": True,
                                    "why": "the drafter in place, measured with this round's eval settings"
                                    if prior else "the drafter in place when accumulated rounds began"}) + "\n")
        curve = read_curve(args.drafter)
        ok, why = should_ship(res["eval"]["tau"], res["eval"]["worst_ece"], curve, settings)
        ok = ok and not args.no_ship
        prev = curve[-1] if curve else {"blocks": 0, "cpu_hours": 0.0}
        fit_log = [json.loads(x) for x in (r.work / "fit" / "train_log.jsonl").read_text().splitlines() if x]
        blocks = max((x.get("blocks", 0) for x in fit_log), default=0)
        spent_h = (time.time() - r.state["started"]) * (os.cpu_count() or 1) / 3600
        row = {"date": date.today().isoformat(), "cpu": describe_machine(), "data_mode": args.data_mode,
               "cursor": res["data"]["cursor_to"], "blocks": prev["blocks"] + blocks,
               "cpu_hours": round(prev["cpu_hours"] + spent_h, 5), "tau": res["eval"]["tau"],
               "tau_by_dataset": res["eval"]["tau_by_dataset"], "worst_ece": res["eval"]["worst_ece"],
               "ece_by_position": res["eval"].get("ece_by_position"),
               "ece_floor_by_position": res["eval"].get("ece_floor_by_position"), "eval": settings,
               "fit_steps": res["fit"]["fit_steps"], "fit_seconds": res["fit"]["fit_seconds"],
               "prompts": res["data"]["prompts"], "sts_set": res["calibrate"].get("sts_set", "pool"),
               "data_seconds": round(res["data"]["seconds"] + res["capture"]["seconds"], 1),
               "shipped": ok, "why": why}
        if ok:
            cand = Path(res["calibrate"]["candidate"])
            for name in ("config.json", "model.safetensors", "sts.json"):
                shutil.copy(cand / name, Path(args.drafter) / name)
        with open(tdir / "curve.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        (tdir / "cursor.json").write_text(json.dumps({"next": res["data"]["cursor_to"]}) + "\n")
        print(f"[continue] {'shipped' if ok else 'not shipped'}: {why}")
        return row

    for name, fn in (("baseline", baseline_stage), ("data", data_stage), ("capture", capture_stage), ("fit", fit_stage),
                     ("calibrate", calibrate_stage), ("eval", eval_stage), ("ship", ship_stage)):
        r.stage(name, fn)
    result = {k: v for k, v in r.state["results"]["ship"].items() if k != "seconds"}
    if not result["shipped"]:  # small, and worth a look (or a recalibration) before it is thrown away
        kept = r.work.with_name(r.work.name + "-candidate")
        shutil.rmtree(kept, ignore_errors=True)
        shutil.move(str(r.work / "candidate"), kept)
        for report in r.work.glob("*_T*.json"):  # its eval and STS-fit reports: per-dataset, per-position detail
            shutil.copy(report, kept / f"report_{report.name}")
        print(f"[continue] the candidate is kept in {kept}")
    shutil.rmtree(r.work, ignore_errors=True)  # the round is recorded; its caches are not reused
    return result
