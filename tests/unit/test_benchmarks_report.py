"""The benchmark report stays a report: BENCHMARKS.md opens with the headline table and stays short, every file under
benchmarks/results/ is cited from BENCHMARKS.md or docs/benchmark-log.md, and no code or doc names the development
process: work rounds named by the word in `WORD` below ("the ninth ..."), scratch folders like `runs/s7`, result
files named after a round. `WORD` stays allowed where it means an HTTP or client connection, a pytest fixture scope
or a POSIX process group (`start_new_...`). The word is spelled in two halves here so that a plain grep for it over
the repository finds only those meanings."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
REPORT = REPO / "BENCHMARKS.md"
LOG = REPO / "docs" / "benchmark-log.md"
MAX_REPORT_LINES = 450

# Directories never scanned for process words: environments, caches, weights, scratch runs, nested checkouts.
SKIP_DIRS = {"models", "runs", "build", "shared", "node_modules", "__pycache__"}
SCANNED_SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".cfg", ".ini"}
SCANNED_NAMES = {"Makefile"}

WORD = "sess" + "ion"
WORD_RE = re.compile(rf"\b{WORD}s?\b", re.I)
ALLOWED_WORD = [
    re.compile(rf"""scope\s*=\s*["']{WORD}["']"""),  # pytest fixture scope
    re.compile(rf"\b(https?|client|aiohttp|requests|httpx|browser|tcp|keep-alive)[\s-]+{WORD}s?\b", re.I),
    re.compile(rf"\b{WORD}\s*=\s*\S"),  # a client connection object in code
    re.compile(rf"\b{WORD}\.(get|post|put|delete|request|close|headers)\b"),
]
PROCESS = [
    re.compile(r"\bruns/s\d+\b"),  # scratch folders named after a work round
    re.compile(r"(?:^|[\s`(/])(?:ab|serve|baseline|acc|sim)_s\d+_"),  # result files named after a work round
]
ROUND_IN_NAME = re.compile(rf"(?:^|[_-])(?:s|{WORD})\d{{1,2}}(?:[_.-]|$)", re.I)
TOKEN = re.compile(r"(?:[\w.*/\-]|\{[^{}\s`]*\})+")


def _expand_braces(token: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out: list[str] = []
    for alt in m.group(1).split(","):
        out += _expand_braces(token[:m.start()] + alt + token[m.end():])
    return out


def cited_refs(text: str) -> set[str]:
    """Every path-like token of a text, braces expanded, relative to benchmarks/results/ where it says so."""
    refs = set()
    for token in TOKEN.findall(text):
        for ref in _expand_braces(token):
            ref = ref.rstrip(".")
            if ref.startswith("benchmarks/results/"):
                ref = ref[len("benchmarks/results/"):]
            if ref:
                refs.add(ref.rstrip("/") if ref != "/" else ref)
    return refs


def is_cited(rel: str, refs: set[str]) -> bool:
    """`rel` (a path under benchmarks/results/) is named, lies in a named folder, or matches a named glob."""
    if rel in refs:
        return True
    parts = rel.split("/")
    if any("/".join(parts[:k]) in refs for k in range(1, len(parts))):
        return True
    return any("*" in ref and fnmatch.fnmatch(rel, ref) for ref in refs)


def results_files() -> list[str]:
    out = []
    for root, dirs, files in os.walk(RESULTS):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".tmp") or name.startswith("."):
                continue
            out.append(str((Path(root) / name).relative_to(RESULTS)).replace(os.sep, "/"))
    return sorted(out)


def scanned_files():
    here = Path(__file__).resolve()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = Path(root) / name
            if (path.suffix in SCANNED_SUFFIXES or name in SCANNED_NAMES) and path.resolve() != here:
                yield path


def process_word_hits(text: str) -> list[str]:
    hits = []
    for line in text.splitlines():
        if WORD_RE.search(line) and not any(p.search(line) for p in ALLOWED_WORD):
            hits.append(line.strip())
        elif any(p.search(line) for p in PROCESS):
            hits.append(line.strip())
    return hits


def test_every_results_file_is_cited():
    refs = cited_refs(REPORT.read_text() + "\n" + LOG.read_text())
    uncited = [rel for rel in results_files() if not is_cited(rel, refs)]
    assert not uncited, f"cite these from BENCHMARKS.md or docs/benchmark-log.md (or remove them): {uncited}"


def test_results_files_are_not_named_after_a_work_round():
    named = [rel for rel in results_files() if any(ROUND_IN_NAME.search(p) for p in rel.split("/"))]
    assert not named, f"name result files by what they measure and the date: {named}"


def test_report_opens_with_the_headline_table_and_stays_short():
    lines = REPORT.read_text().splitlines()
    assert len(lines) <= MAX_REPORT_LINES, f"BENCHMARKS.md has {len(lines)} lines: move history to docs/benchmark-log.md"
    headings = [ln for ln in lines if ln.startswith("## ")]
    assert headings and headings[0] == "## Headline", headings[:1]
    start = lines.index("## Headline")
    section = lines[start + 1:lines.index(headings[1]) if len(headings) > 1 else len(lines)]
    header = next((ln for ln in section if ln.startswith("|")), "")
    for column in ("claim", "number", "command", "date", "machine", "met"):
        assert column in header, f"headline table lacks a {column!r} column: {header}"


def test_no_development_process_words_in_code_or_docs():
    hits = {}
    for path in scanned_files():
        try:
            found = process_word_hits(path.read_text(errors="replace"))
        except OSError:
            continue
        if found:
            hits[str(path.relative_to(REPO))] = found[:3]
    assert not hits, f"words of the development process (date the measurement instead): {hits}"


def test_the_checks_themselves():
    refs = cited_refs("see `benchmarks/results/ab-t0-2026-12-01.{json,png}`, `traces/` and `plots_*_T{0,1}/x.png`.")
    assert {"ab-t0-2026-12-01.json", "ab-t0-2026-12-01.png", "traces", "plots_*_T0/x.png"} <= refs
    assert is_cited("traces/dspark/c1_T0.jsonl", refs) and is_cited("plots_dspark_T1/x.png", refs)
    assert not is_cited("ab-t1-2026-12-01.json", refs) and not is_cited("plots_dspark_T1/y.png", refs)
    assert process_word_hits(f"measured in the ninth {WORD}") and process_word_hits("out runs/s7/ab.json")
    assert process_word_hits("`ab_s8_T0.json`") and process_word_hits(f"built once per {WORD}")
    assert not process_word_hits(f'@pytest.fixture(scope="{WORD}")')
    assert not process_word_hits(f"one HTTP {WORD} per client; subprocess.Popen(cmd, start_new_{WORD}=True)")
    assert ROUND_IN_NAME.search("serve_s5_rep1.json") and not ROUND_IN_NAME.search("serve-t1-repeat1-2026-11-30.json")
