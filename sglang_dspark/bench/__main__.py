"""`python -m sglang_dspark.bench {baseline,serve,ab,single_stream,sim,draft_cost,acceptance_report,repeats,
grammar_mix,learning_curves,training_rounds}`."""

from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS = {
    "baseline": "sglang_dspark.bench.baseline",
    "serve": "sglang_dspark.bench.serve",
    "ab": "sglang_dspark.bench.ab",
    "single_stream": "sglang_dspark.bench.single_stream",
    "sim": "sglang_dspark.bench.sim",
    "draft_cost": "sglang_dspark.bench.draft_cost",
    "acceptance_report": "sglang_dspark.bench.acceptance_report",
    "repeats": "sglang_dspark.bench.repeats",
    "grammar_mix": "sglang_dspark.bench.grammar_mix",
    "learning_curves": "sglang_dspark.bench.learning_curves",
    "training_rounds": "sglang_dspark.bench.training_rounds",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sglang_dspark.bench")
    sub = parser.add_subparsers(dest="cmd", required=True)
    modules = {}
    for name, mod_name in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name != mod_name:
                raise
            continue
        modules[name] = mod
        mod.add_args(sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0]))
    args = parser.parse_args(argv)
    modules[args.cmd].run(args)


if __name__ == "__main__":
    main()
