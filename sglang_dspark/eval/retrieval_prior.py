"""Fit the retrieval drafts' confidence prior from greedy outputs of a real server.

    python -m sglang_dspark.eval.retrieval_prior [--prompts train/livecodebench.jsonl ...] [--limit 16]
        [--max-tokens 256] [--concurrency 8] [--out <drafter>/retrieval_confidence.json]

Starts the target without speculation (`--no-dspark`, the serving dtype), sends each prompt through the chat
template (train.chat.render_prompt, as eval_acceptance does) at T = 0 and fits retrieval.confidence.fit_table on (prompt ids, output ids): at every output position, the
prompt/output lookup chain a T = 0 server would verify there and how far it matches what the target really said
(exact: greedy outputs do not depend on speculation). The default prompts are training sets, none of the eval mix
the benchmarks measure. Outputs are cached next to --out (`.outputs.jsonl`), so a rerun resumes.

    python -m sglang_dspark.eval.retrieval_prior --conversations runs/data/generated.jsonl

fits on greedy answers that already exist instead (`train generate --temperature 0` rows: the user turn through the
chat template, the assistant turn re-tokenised), with no server.

    python -m sglang_dspark.eval.retrieval_prior --conversations runs/seed/proc.jsonl --table-only \
        --ngram-table <drafter>/ngram_table.npz

builds the n-gram table of those answers (retrieval/ngram_table.py) and fits its confidence prior, leaving the
prompt lookup's prior as it is; by default each answer is scored against a table of the other prompt families
(--table-fit), as an eval prompt meets a table that never saw its prompt set.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

DEFAULT_PROMPTS = ("train/livecodebench.jsonl", "train/arena-hard-v2.jsonl", "train/swe-bench.jsonl",
                   "train/aime24.jsonl")


def parse_args(argv=None) -> argparse.Namespace:
    from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR

    p = argparse.ArgumentParser(prog="python -m sglang_dspark.eval.retrieval_prior", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(DEFAULT_TARGET_DIR))
    p.add_argument("--drafter", default=str(DEFAULT_DRAFTER_DIR), help="where the prior goes by default; its "
                   "block_size is the number of positions fitted")
    p.add_argument("--prompts", nargs="+", default=list(DEFAULT_PROMPTS))
    p.add_argument("--limit", type=int, default=16, help="prompts per file")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--server-args", default="", help="extra flags for the server (e.g. --dtype float32)")
    p.add_argument("--out", default=None, help="default: <drafter>/retrieval_confidence.json")
    p.add_argument("--conversations", nargs="+", default=None,
                   help="greedy `train generate` JSONL files to fit on instead of asking a server")
    p.add_argument("--ngram-table", default=None, metavar="PATH.npz",
                   help="also build the n-gram table of the target's answers (retrieval/ngram_table.py) from all "
                        "sequences and write it here (<drafter>/ngram_table.npz is what the server loads by "
                        "default); its confidence prior is fitted on --table-holdout of them, left out of a table "
                        "built from the rest, so it is scored on answers the table never saw")
    p.add_argument("--table-only", action="store_true",
                   help="with --ngram-table: keep the other sources' prior already at --out, refit the table's only")
    p.add_argument("--table-fit", choices=TABLE_FITS, default="leave-family-out",
                   help="how the table prior is scored: each answer against a table of the other prompt families "
                        "(default), or a random held-out share against a table of the rest")
    p.add_argument("--table-holdout", type=float, default=0.1, help="with --table-fit holdout: share of sequences "
                   "the table prior is fitted on")
    return p.parse_args(argv)


def conversation_rows(tok, paths: list[str]) -> list[tuple[str, list[int], list[int]]]:
    """(prompt family, prompt ids, answer ids) of single-turn user/assistant rows; other rows are skipped. The
    family is the row's `source` (`train generate` writes the prompt set's name there), else its file's name."""
    from sglang_dspark.train.chat import render_prompt

    out = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            msgs = row.get("messages") or []
            if len(msgs) != 2 or [m.get("role") for m in msgs] != ["user", "assistant"]:
                continue
            answer = tok.encode(msgs[1]["content"], add_special_tokens=False)
            if answer:
                out.append((row.get("source") or Path(path).stem, render_prompt(tok, msgs[0]["content"]), answer))
    if not out:
        raise ValueError(f"{paths}: no user/assistant rows to fit on")
    return out


def conversation_sequences(tok, paths: list[str]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of conversation_rows."""
    return [(prompt, answer) for _, prompt, answer in conversation_rows(tok, paths)]


TABLE_FITS = ("leave-family-out", "holdout")


def table_proposers(rows, fit: str, holdout: float):
    """(sequences scored, one propose per scored sequence) for the table prior.

    leave-family-out: every answer against a table of the other prompt families only (holdout where there is one
    family), as a request from a prompt set the table never saw meets it. holdout: every 1/holdout-th answer against
    a table of the rest. Scored on eval-set answers (benchmarks/table_prior_study.py, 2026-12-07, pooled cells),
    leave-family-out's frozen ECE is 11% at position 1 and 1-6% at 2-7, holdout's 13% and 7-10% (over-confident past
    position 1: held-out answers of the same families continue each other's phrases); refined online both have
    log-loss 0.560."""
    from sglang_dspark.retrieval import NgramTable

    families = sorted({f for f, _, _ in rows})
    if fit == "leave-family-out" and len(families) >= 2:
        tables = {f: NgramTable.build([o for g, _, o in rows if g != f]) for f in families}
        return [(p, o) for _, p, o in rows], [lambda ctx, n, t=tables[f]: t.candidate(ctx, n, source=3)
                                              for f, _, _ in rows]
    if not 0 < holdout < 1:
        raise ValueError(f"--table-holdout must be in (0, 1), got {holdout}")
    every = max(2, round(1 / holdout))
    rest = NgramTable.build([o for i, (_, _, o) in enumerate(rows) if i % every])
    held = [(p, o) for i, (_, p, o) in enumerate(rows) if i % every == 0]
    return held, [lambda ctx, n: rest.candidate(ctx, n, source=3)] * len(held)


def fit_ngram_table(rows, gamma: int, path: str, holdout: float, fit: str = "leave-family-out") -> list:
    """Builds the n-gram table from every answer of `rows` (conversation_rows) into `path` and returns the table
    source's prior cells, fitted as table_proposers says."""
    from sglang_dspark.retrieval import NgramTable
    from sglang_dspark.retrieval.confidence import fit_table

    scored, proposers = table_proposers(rows, fit, holdout)
    conf = fit_table(scored, gamma, source="table", proposers=proposers)
    full = NgramTable.build([o for _, _, o in rows])
    full.save(path)
    print(f"n-gram table: {full.tokens} answer tokens -> {path}; its prior fitted ({fit}) on {len(scored)} answers "
          f"the table they met never saw, scored per position {conf.scored('table')}")
    return conf.table["table"].tolist()


def collect(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int, cache: Path) -> list[tuple]:
    """(prompt ids, greedy output ids) per prompt; the ones in `cache` are not asked again."""
    import requests

    done = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            row = json.loads(line)
            done[tuple(row["prompt"])] = row["output"]
    todo = [p for p in prompts if tuple(p) not in done]

    def one(ids: list[int]) -> tuple[list[int], list[int]]:
        r = requests.post(url + "/generate", timeout=3600, json={
            "input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_tokens}})
        if r.status_code != 200:
            raise RuntimeError(f"/generate answered {r.status_code}: {r.text[:300]}")
        return ids, r.json()["output_ids"]

    with ThreadPoolExecutor(concurrency) as pool, open(cache, "a") as f:
        for ids, out in tqdm(pool.map(one, todo), total=len(todo), desc="greedy outputs"):
            done[tuple(ids)] = out
            f.write(json.dumps({"prompt": ids, "output": out}) + "\n")
            f.flush()
    return [(list(p), done[tuple(p)]) for p in prompts]


def main(argv=None) -> dict:
    import shlex

    from transformers import AutoTokenizer

    from sglang_dspark.bench.machine import describe_machine
    from sglang_dspark.bench.prompts import load_prompts
    from sglang_dspark.bench.server import ServerProcess
    from sglang_dspark.drafter import DSparkConfig
    from sglang_dspark.retrieval.confidence import FILE_NAME, fit_table
    from sglang_dspark.train.chat import render_prompt

    args = parse_args(argv)
    out = Path(args.out) if args.out else Path(args.drafter) / FILE_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    cache = out.with_name(out.stem + ".outputs.jsonl")
    tok = AutoTokenizer.from_pretrained(args.model)
    if args.conversations:
        rows = conversation_rows(tok, args.conversations)
        sequences = [(prompt, answer) for _, prompt, answer in rows]
        source = {"conversations": [Path(p).name for p in args.conversations]}
    else:
        texts = [(Path(path).stem, t) for path in args.prompts for t in load_prompts(path, args.limit)]
        ids = [render_prompt(tok, t) for _, t in texts]  # as eval_acceptance renders its prompts
        flags = ["--model-path", args.model, "--no-dspark", *shlex.split(args.server_args)]
        with ServerProcess(flags, startup_timeout_s=900) as srv:
            sequences = collect(srv.base_url, ids, args.max_tokens, args.concurrency, cache)
        source = {"prompts": list(args.prompts), "max_tokens": args.max_tokens}
        rows = [(family, p, o) for (family, _), (p, o) in zip(texts, sequences)]
    gamma = DSparkConfig.from_json(args.drafter).block_size
    tokens = sum(len(o) for _, o in sequences)
    fitted_on = {**source, "sequences": len(sequences), "tokens": tokens, "machine": describe_machine()}
    if args.table_only:
        if not args.ngram_table or not out.exists():
            raise SystemExit("--table-only needs --ngram-table and an existing prior at --out")
        data = json.loads(out.read_text())
    else:
        conf = fit_table(sequences, gamma)
        data = {**conf.to_json(), "fitted_on": fitted_on}
        scored = conf.scored("prompt")
        print(f"retrieval prior: {len(sequences)} outputs, {tokens} tokens; lookup chains "
              f"scored per position {scored}; in-sample ECE {[round(e, 4) for e in conf.ece('prompt')]} -> {out}")
    if args.ngram_table:
        data["table"]["table"] = fit_ngram_table(rows, gamma, args.ngram_table, args.table_holdout, args.table_fit)
        data["table_fitted_on"] = {**fitted_on, "fit": args.table_fit, "families": sorted({f for f, _, _ in rows})}
    out.write_text(json.dumps(data) + "\n")
    return data


if __name__ == "__main__":
    main()
