"""Build code-edit.jsonl: real functions from the Python standard library that ships with the interpreter, each
with an edit instruction whose answer is the whole function again, changed a little ("add type hints", ...). This
is where retrieval drafting is used in production: the answer copies most of the prompt.

    python benchmarks/workloads/make_code_edit.py   # writes benchmarks/workloads/code-edit.jsonl (deterministic)
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import textwrap
from pathlib import Path

from sglang_dspark.bench.prompts import CODE_EDIT_MODULES as MODULES

INSTRUCTIONS = (
    "Add type hints to this Python function. Return the whole function and nothing else.",
    "Add a docstring to this Python function. Return the whole function and nothing else.",
    "Rename the local variables of this Python function to longer, descriptive names. Return the whole function "
    "and nothing else.",
)
MIN_LINES, MAX_LINES = 8, 30
COUNT = 48


def functions():
    for name in MODULES:
        module = importlib.import_module(name)
        source = inspect.getsource(module)
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
                text = ast.get_source_segment(source, node)
                if text and MIN_LINES <= text.count("\n") + 1 <= MAX_LINES:
                    yield name, node.name, textwrap.dedent(text)


def main() -> None:
    rows = []
    for i, (module, fn, text) in enumerate(sorted(functions())):
        instruction = INSTRUCTIONS[i % len(INSTRUCTIONS)]
        rows.append({"turns": [f"{instruction}\n\n```python\n{text}\n```"], "source": f"{module}.{fn}"})
    step = max(1, len(rows) // COUNT)
    rows = rows[::step][:COUNT]
    out = Path(__file__).with_name("code-edit.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{out}: {len(rows)} functions")


if __name__ == "__main__":
    main()
