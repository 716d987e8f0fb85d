"""Would verifying two retrieval chains at once (a two-branch tree: the prompt-lookup chain and the n-gram table's
chain, both from the same anchor) beat verifying the better one? Scored offline on greedy answers the way a T = 0
server at c = 1 walks them: per step, each source's chain is cut at the length that maximises its expected accepted
drafts minus the price of its verify rows (the shipped confidences, frozen), then

  single  verifies the chain with the larger expected accepted drafts over its whole length (the choice
          RetrievalDrafter.propose makes among retrieval sources), as served;
  tree    verifies both and keeps the longer accepted prefix, paying for both chains' rows.

Step time is modelled as plain_ms + row_ms * verified rows (the measured c = 1 step costs on the CPU named in the
result). The answer is a speed ratio to plain decoding for each scheme.

    python benchmarks/two_chain_study.py --eval runs/seed/eval.jsonl --out benchmarks/results/two-chain-study-DATE-CPU
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_dspark.bench.machine import describe_machine  # noqa: E402
from sglang_dspark.retrieval import NgramTable, prompt_candidate  # noqa: E402
from sglang_dspark.retrieval.confidence import FILE_NAME, RetrievalConfidence  # noqa: E402
from seed_table_study import accepted  # noqa: E402


def best_cut(p: np.ndarray, price: float) -> int:
    """How many drafts to verify: the l maximising sum_{j<l} S_j - price * l (0 where no l gains)."""
    gain = np.cumsum(np.cumprod(p) - price)
    return int(gain.argmax()) + 1 if gain.size and gain.max() > 0 else 0


def walk(seqs, table, conf, gamma: int, plain_ms: float, row_ms: float, scheme: str) -> dict:
    price = row_ms / plain_ms
    tokens = steps = rows_total = two = differ = 0
    ms = 0.0
    for prompt, output in seqs:
        ctx = np.asarray(list(prompt) + list(output), dtype=np.int64)
        P, t = len(prompt), 0
        while t < len(output):
            c, truth = ctx[: P + t], ctx[P + t:]
            chains = []
            if scheme != "plain":
                for name, cand in (("prompt", prompt_candidate(c, gamma, source=1)),
                                   ("table", table.candidate(c, gamma, source=3))):
                    if cand is None:
                        continue
                    p = conf.probs(name, cand.match_len, cand.count, min(gamma, cand.tokens.size), 0,
                                   cand.match_lens, cand.counts)
                    n = best_cut(np.asarray(p), price)
                    if n:
                        chains.append((float(np.cumprod(p).sum()), n, cand))
            if not chains:
                a, rows = 0, 0
            elif scheme == "single":
                _, n, cand = max(chains, key=lambda x: x[0])
                a, rows = accepted(cand.tokens[:n], truth), n
            else:
                accs = [accepted(cand.tokens[:n], truth) for _, n, cand in chains]
                a, rows = max(accs), sum(n for _, n, _ in chains)
                if len(chains) == 2:
                    two += 1
                    differ += accs[0] != accs[1]
            steps += 1
            tokens += a + 1
            rows_total += rows
            ms += plain_ms + row_ms * rows
            t += a + 1
    return {"scheme": scheme, "steps": steps, "tokens": tokens, "tokens_per_step": tokens / steps,
            "rows_per_step": rows_total / steps, "model_ms": ms, "tok_per_s": 1000 * tokens / ms,
            "steps_with_two_chains": two, "two_chain_steps_accepting_differently": differ}


def main() -> None:
    from transformers import AutoTokenizer

    from sglang_dspark.embedded import DEFAULT_DRAFTER_DIR, DEFAULT_TARGET_DIR
    from sglang_dspark.eval.retrieval_prior import conversation_sequences

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eval", nargs="+", required=True, help="greedy answers (train generate rows), scoring only")
    p.add_argument("--drafter", default=str(DEFAULT_DRAFTER_DIR))
    p.add_argument("--gamma", type=int, default=7)
    p.add_argument("--plain-ms", type=float, default=69.5, help="a plain decode step (measured c = 1 step cost)")
    p.add_argument("--row-ms", type=float, default=3.2, help="one more verified draft row")
    p.add_argument("--out", required=True, help="output stem: <out>.json")
    args = p.parse_args()
    seqs = conversation_sequences(AutoTokenizer.from_pretrained(str(DEFAULT_TARGET_DIR)), args.eval)
    drafter = Path(args.drafter)
    table = NgramTable.load(drafter / "ngram_table.npz")
    conf = RetrievalConfidence.from_file(args.gamma, drafter / FILE_NAME)
    rows = [walk(seqs, table, conf, args.gamma, args.plain_ms, args.row_ms, s) for s in ("plain", "single", "tree")]
    base = rows[0]["tok_per_s"]
    for r in rows:
        r["speed_vs_plain"] = r["tok_per_s"] / base
        print(f"{r['scheme']:6s} tokens/step {r['tokens_per_step']:.3f} rows/step {r['rows_per_step']:.2f} "
              f"speed {r['speed_vs_plain']:.3f}x plain")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": describe_machine(), "eval": [Path(e).name for e in args.eval], "answers": len(seqs),
              "gamma": args.gamma, "plain_ms": args.plain_ms, "row_ms": args.row_ms, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    plot(rows, report, out.with_suffix(".png"))


def plot(rows: list[dict], report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    names = [r["scheme"] for r in rows]
    axes[0].bar(names, [r["tokens_per_step"] for r in rows], color="tab:blue")
    axes[0].set(ylabel="tokens per step", title="accepted + bonus")
    axes[1].bar(names, [r["speed_vs_plain"] for r in rows], color="tab:green")
    axes[1].set(ylabel="modelled speed / plain", title=f"step = {report['plain_ms']} ms + {report['row_ms']} ms a row")
    for ax in axes:
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"two-chain tree vs best chain, {report['answers']} greedy answers; {report['machine']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
