"""Offline study: how many draft tokens a static n-gram table of the target's own outputs (retrieval/ngram_table.py)
would get accepted on eval-set answers, beside prompt lookup and the cross-request corpus.

Every output position of every eval answer is a draft point (T = 0: greedy answers do not depend on speculation).
At each, the chain of each source is compared with the true continuation; the table is built from seed answers
(training prompts, never eval ones) of growing size, so the reading is a learning curve. The corpus here is
SGLang's trie fed the eval answers before the current one, as a c = 1 server would have it.

    python benchmarks/seed_table_study.py --seed runs/seed/proc.jsonl --eval runs/seed/eval.jsonl \
        --out benchmarks/results/seed-table-study-<date>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_dspark.retrieval import prompt_candidate  # noqa: E402
from sglang_dspark.retrieval.ngram_table import NgramTable  # noqa: E402

GAMMA = 7


def load_pairs(path: str, tok) -> list[tuple[str, np.ndarray, np.ndarray]]:
    out = []
    for line in open(path):
        if not line.strip():
            continue
        row = json.loads(line)
        msgs = row["messages"]
        prompt = tok.apply_chat_template(msgs[:1], tokenize=True, add_generation_prompt=True)
        if not isinstance(prompt, list):
            prompt = prompt["input_ids"]
        answer = tok.encode(msgs[1]["content"], add_special_tokens=False)
        out.append((row.get("source", ""), np.asarray(prompt, dtype=np.int64), np.asarray(answer, dtype=np.int64)))
    return out


def accepted(chain, truth) -> int:
    n = min(len(chain), len(truth))
    same = np.asarray(chain[:n]) == np.asarray(truth[:n])
    return int(n if same.all() else np.argmin(same))


def study(seed, evals, sizes, use_corpus: bool):
    rows = {}
    corpus = None
    if use_corpus:
        from sglang_dspark.sglang_plugin.retrieval_corpus import OutputCorpus
    for size in sizes:
        table = NgramTable.build([a for _, _, a in seed[:size]]) if size else None
        if use_corpus:
            corpus = OutputCorpus(GAMMA)
        acc = {"prompt": [], "corpus": [], "table": []}
        first = []  # (order, top, total, first accepted) of table chains
        best_old, best_new = [], []
        for j, (_, prompt, answer) in enumerate(tqdm(evals, desc=f"seed {size}", leave=False)):
            ctx = np.concatenate([prompt, answer])
            P = prompt.size
            for t in range(answer.size - 1):
                c = ctx[: P + t]
                truth = ctx[P + t: P + t + GAMMA]
                pc = prompt_candidate(c, GAMMA, source=1)
                a_p = accepted(pc.tokens, truth) if pc is not None else 0
                a_c = 0
                if corpus is not None:
                    cand = corpus.candidates([f"r{j}"], [c])[0]
                    a_c = accepted(cand.tokens, truth) if cand is not None else 0
                a_t = 0
                if table is not None:
                    ch = table.chain(c, GAMMA)
                    if ch:
                        a_t = accepted([s.token for s in ch], truth)
                        first.append((ch[0].order, ch[0].top, ch[0].total, a_t))
                acc["prompt"].append(a_p)
                acc["corpus"].append(a_c)
                acc["table"].append(a_t)
                best_old.append(max(a_p, a_c))
                best_new.append(max(a_p, a_c, a_t))
            if corpus is not None:
                corpus._trie.batch_put([[int(x) for x in answer]])
                corpus._trie.synchronize()
        f = np.asarray(first) if first else np.zeros((0, 4))
        by_ratio = {}
        if f.size:
            ratio = f[:, 1] / f[:, 2]
            for lo, hi in ((0, .3), (.3, .5), (.5, .7), (.7, .9), (.9, 1.01)):
                m = (ratio >= lo) & (ratio < hi)
                if m.any():
                    by_ratio[f"{lo}-{hi}"] = {"n": int(m.sum()), "first_accept": float((f[m, 3] > 0).mean()),
                                              "mean_accepted": float(f[m, 3].mean())}
        rows[size] = {
            "seed_answers": size, "seed_tokens": table.tokens if table else 0, "points": len(best_old),
            "mean_accepted": {k: float(np.mean(v)) for k, v in acc.items()},
            "first_accept": {k: float(np.mean(np.asarray(v) > 0)) for k, v in acc.items()},
            "oracle_prompt_corpus": float(np.mean(best_old)),
            "oracle_with_table": float(np.mean(best_new)),
            "table_by_first_ratio": by_ratio,
        }
        print(json.dumps(rows[size]))
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seed", nargs="+", required=True, help="greedy answers to training prompts, in this order")
    p.add_argument("--eval", required=True)
    p.add_argument("--sizes", type=int, nargs="+", default=None)
    p.add_argument("--no-corpus", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from transformers import AutoTokenizer

    from sglang_dspark.embedded import DEFAULT_TARGET_DIR

    tok = AutoTokenizer.from_pretrained(str(DEFAULT_TARGET_DIR))
    seed, evals = [row for path in args.seed for row in load_pairs(path, tok)], load_pairs(args.eval, tok)
    sizes = args.sizes or sorted({0, len(seed) // 8, len(seed) // 4, len(seed) // 2, len(seed)})
    rows = study(seed, evals, sizes, not args.no_corpus)
    Path(args.out + ".json").write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [rows[s]["seed_tokens"] for s in sizes]
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in ("prompt", "corpus", "table"):
        ax.plot(xs, [rows[s]["mean_accepted"][k] for s in sizes], marker="o", label=k)
    ax.plot(xs, [rows[s]["oracle_with_table"] for s in sizes], marker="s", label="best of all (oracle)")
    ax.plot(xs, [rows[s]["oracle_prompt_corpus"] for s in sizes], ls="--", label="best of prompt, corpus (oracle)")
    ax.set_xlabel("seed tokens in the table")
    ax.set_ylabel("accepted drafts per draft point (γ = 7)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=120)


if __name__ == "__main__":
    main()
