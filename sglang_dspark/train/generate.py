"""Stage `generate`: regenerate assistant responses with the target through SGLang's offline Engine.

The drafter must learn the target's own distribution, not the dataset authors', so every training prompt is answered
again by the target (reference recipe: temperature 0.7, top-p 0.8, top-k 20). Output rows are
`{"id", "source", "messages": [{"role", "content"}, ...]}`, appended chunk by chunk so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tqdm import tqdm

DEFAULT_SOURCES = ["arena-hard-v2", "livecodebench", "lbpp", "swe-bench", "aime24", "aime25"]
# what `train continue` walks with its cursor: the files, then prompts of the eval sets' kinds made here
TRAIN_POOL = DEFAULT_SOURCES + ["proc-math", "proc-code", "proc-chat"]
MAX_PROMPT_CHARS = 2000  # long prompts (swe-bench) cost CPU prefill time; the drafter learns from responses


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="target HF dir (default: embedded model)")
    p.add_argument("--out", default="runs/data/generated.jsonl")
    p.add_argument("--sources", nargs="+", default=DEFAULT_SOURCES,
                   help="names under shared/data/train, JSONL paths, or proc-math / proc-code / proc-chat (made here, "
                        "train/procedural.py)")
    p.add_argument("--limit", type=int, default=None, help="max prompts in total (interleaved over sources)")
    p.add_argument("--offset", type=int, default=0, help="skip this many prompts of the interleaved list first")
    p.add_argument("--max-new-tokens", type=int, default=384)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--batch", type=int, default=32, help="prompts per Engine.generate call (one resume unit)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-total-tokens", type=int, default=65536)
    p.add_argument("--dtype", default="auto",
                   help="Engine dtype (auto = the model's); float32 is ~4x faster than bf16 on CPUs without "
                        "AVX512-BF16, and its greedy text differs from bf16's only at near-ties")
    p.add_argument("--url", default=None,
                   help="drive a running SGLang server or sglang-router (OpenAI API at URL/v1) instead of starting "
                        "an Engine here: generation scales with the cluster behind it; --batch requests in flight")
    p.add_argument("--model", default="default", help="model name sent with --url requests")


def _load_prompt_rows(sources: list[str]) -> list[tuple[str, str, str]]:
    """(id, source, prompt) of the prompt files, interleaved; then the procedural sources named (train/procedural.py),
    interleaved among themselves, so adding them leaves the files' positions, and so the cursor, where they were."""
    from sglang_dspark.bench.prompts import data_root

    from . import procedural

    made = [s for s in sources if s in procedural.SOURCES]
    sources = [s for s in sources if s not in procedural.SOURCES]
    per_source = []
    for src in sources:
        path = Path(src) if src.endswith(".jsonl") else data_root() / "train" / f"{src}.jsonl"
        name = path.stem
        rows = []
        with open(path) as f:
            for i, line in enumerate(f):
                if line.strip():
                    rows.append((f"{name}-{i}", name, json.loads(line)["turns"][0][:MAX_PROMPT_CHARS]))
        per_source.append(rows)
    # Interleave so a --limit run still covers every domain.
    out = []
    for i in range(max((len(r) for r in per_source), default=0)):
        out.extend(r[i] for r in per_source if i < len(r))
    return out + (procedural.rows(tuple(made)) if made else [])


def run(args: argparse.Namespace) -> None:
    from sglang_dspark.embedded import DEFAULT_TARGET_DIR

    target = args.target or str(DEFAULT_TARGET_DIR)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        with open(out) as f:
            done = {json.loads(line)["id"] for line in f if line.strip()}
    rows = _load_prompt_rows(args.sources)[args.offset:]
    if args.limit is not None:
        rows = rows[: args.limit]
    todo = [r for r in rows if r[0] not in done]
    print(f"generate: {len(rows)} prompts, {len(done)} already done, {len(todo)} to go -> {out}")
    if not todo:
        return

    if args.url:
        return _run_remote(args, rows, todo, out)
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import sglang as sgl
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    engine = sgl.Engine(model_path=target, device="cpu", attention_backend="torch_native",
                        max_total_tokens=args.max_total_tokens, log_level="warning", random_seed=args.seed,
                        dtype=args.dtype)
    params = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
              "max_new_tokens": args.max_new_tokens}
    bar = tqdm(total=len(rows), initial=len(rows) - len(todo), desc="generate", unit="prompt")
    n_tokens = 0
    try:
        for start in range(0, len(todo), args.batch):
            chunk = todo[start : start + args.batch]
            texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                             add_generation_prompt=True) for _, _, p in chunk]
            outs = engine.generate(prompt=texts, sampling_params=params)
            with open(out, "a") as f:
                for (rid, src, prompt), o in zip(chunk, outs):
                    n_tokens += o["meta_info"]["completion_tokens"]
                    f.write(json.dumps({"id": rid, "source": src, "messages": [
                        {"role": "user", "content": prompt}, {"role": "assistant", "content": o["text"]}]}) + "\n")
            bar.update(len(chunk))
            bar.set_postfix(tokens=n_tokens)
    finally:
        bar.close()
        engine.shutdown()


def _run_remote(args: argparse.Namespace, rows: list, todo: list, out: Path) -> None:
    """Chat completions against args.url, --batch at a time; each finished chunk is appended (resume unit)."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="EMPTY", timeout=3600, max_retries=2)
    extra = {"top_k": args.top_k} if args.top_k else {}

    def answer(prompt: str):
        r = client.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": prompt}], temperature=args.temperature,
            top_p=args.top_p, max_tokens=args.max_new_tokens, seed=args.seed, extra_body=extra)
        return r.choices[0].message.content or "", r.usage.completion_tokens if r.usage else 0

    bar = tqdm(total=len(rows), initial=len(rows) - len(todo), desc="generate", unit="prompt")
    n_tokens = 0
    with ThreadPoolExecutor(max_workers=args.batch) as pool:
        for start in range(0, len(todo), args.batch):
            chunk = todo[start: start + args.batch]
            answers = list(pool.map(answer, [p for _, _, p in chunk]))
            with open(out, "a") as f:
                for (rid, src, prompt), (text, n) in zip(chunk, answers):
                    n_tokens += n
                    f.write(json.dumps({"id": rid, "source": src, "messages": [
                        {"role": "user", "content": prompt}, {"role": "assistant", "content": text}]}) + "\n")
            bar.update(len(chunk))
            bar.set_postfix(tokens=n_tokens)
    bar.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.train generate")
    add_args(p)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
