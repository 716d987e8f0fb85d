"""Training prompts made here, without a dataset: grade-school word problems, function-completion tasks over the
Python standard library, and everyday chat requests.

The prompt files under shared/data/train lean on hard competition code, long issues and hard chat; the eval sets
are grade-school math, function completion and everyday chat, and a drafter fitted on the former alone gains
nothing on the latter (2026-12-02 rounds: held-out tau 1.87 on the training mix, 1.40 on the eval sets). These
sources fill the gap with prompts of the eval sets' kind, never their text. Every prompt is a pure function of
(source, index), so the pool, and the cursor into it, mean the same on every machine with the same Python.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import random
import textwrap

from ..bench.prompts import CODE_EDIT_MODULES

SOURCES = ("proc-math", "proc-code", "proc-chat")
PER_SOURCE = 3000  # pool size per source; the index space is larger, the pool is what the cursor walks

NAMES = ("Ava", "Ben", "Chloe", "Diego", "Elif", "Farah", "Goran", "Hana", "Ivan", "Jia", "Kofi", "Lena", "Mateo",
         "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tomas", "Uma", "Viktor", "Wen", "Yusuf", "Zara")
ITEMS = (("apple", "apples"), ("notebook", "notebooks"), ("pencil", "pencils"), ("cupcake", "cupcakes"),
         ("ticket", "tickets"), ("marble", "marbles"), ("sticker", "stickers"), ("book", "books"),
         ("plant", "plants"), ("toy car", "toy cars"), ("muffin", "muffins"), ("shirt", "shirts"))
PLACES = ("bakery", "farm", "bookshop", "school fair", "garden centre", "market", "library sale", "toy store")


def _math(rng: random.Random) -> str:
    n1, n2 = rng.sample(NAMES, 2)
    item, items = rng.choice(ITEMS)
    place = rng.choice(PLACES)
    a, b, c = rng.randint(3, 40), rng.randint(2, 15), rng.randint(2, 9)
    price = rng.choice((0.5, 1.25, 2, 3, 4.5, 6, 8, 12))
    pct = rng.choice((10, 15, 20, 25, 30, 40, 50))
    speed, hours = rng.randint(20, 70), rng.randint(2, 6)
    templates = (
        f"{n1} buys {a} {items} at the {place} for ${price} each and pays with a ${int(a * price) + c * 5} bill. "
        f"How much change does {n1} get?",
        f"{n1} has {a} {items}. {n2} has {b} more than twice as many as {n1}. How many {items} do they have "
        f"together?",
        f"A {place} sold {a} {items} on Monday, {b} fewer on Tuesday, and {c} times as many on Wednesday as on "
        f"Tuesday. How many {items} did it sell in the three days?",
        f"{n1} drives at {speed} miles per hour for {hours} hours, then at {speed - 10} miles per hour for "
        f"{c} more hours. How far does {n1} drive in total?",
        f"A {item} costs ${price * 4}. During a sale the price is cut by {pct}%. {n1} buys {c} of them. How much "
        f"does {n1} spend?",
        f"{n1} is {b + 20} years old and {n2} is {b} years old. In how many years will {n1} be exactly twice as old "
        f"as {n2}?",
        f"{n1} saves ${a} every week. After {b} weeks {n1} spends a quarter of the savings on {items}. How much "
        f"money is left?",
        f"{n1} can paint a fence in {c + 2} hours and {n2} can paint it in {c + 4} hours. How long does it take "
        f"them to paint it together?",
        f"There are {a * 4} students in a school. {pct}% of them walk to school, and half of the rest take the "
        f"bus. How many students take the bus?",
        f"{n1} reads {b} pages of a {a * 10}-page book every day. After {c} days, how many pages are left, and "
        f"how many more days will {n1} need to finish the book?",
        f"A recipe needs {c} cups of flour for {b} {items}. How many cups of flour are needed for {b * a} "
        f"{items}?",
        f"{n1} earns ${speed} an hour and works {hours + 3} hours a day, {c} days a week. {n1} pays {pct}% of it in "
        f"tax. How much does {n1} keep each week?",
    )
    return rng.choice(templates)


CODE_MODULES = ("urllib.parse", "email.utils", "ipaddress", "fractions", "configparser", "pathlib", "random",
                "html", "inspect", "dataclasses", "functools", "tokenize", "pprint", "reprlib", "mimetypes",
                "tempfile", "traceback", "optparse", "getopt", "ntpath", "genericpath", "shutil", "logging",
                "doctest", "cmd", "copy", "dis", "filecmp", "fileinput", "gzip", "linecache", "pickletools",
                "platform", "py_compile", "selectors", "sysconfig", "types", "wave", "zipfile", "tarfile",
                "ast", "argparse", "locale", "smtplib", "imaplib", "ftplib", "plistlib", "uuid", "numbers",
                "operator", "codecs", "collections", "enum", "typing", "string.templatelib", "tomllib._parser",
                "importlib.metadata", "json.tool", "http.cookies", "http.client", "xml.dom.minidom", "zipimport")
HELD_OUT_MODULES = CODE_EDIT_MODULES  # the code-editing benchmark's: never trained on


@functools.lru_cache(maxsize=1)
def stdlib_functions() -> tuple[tuple[str, str, str, str], ...]:
    """(module, name, signature line, docstring) of documented functions and methods, sorted."""
    out = []
    for name in CODE_MODULES:
        if name in HELD_OUT_MODULES:
            continue
        try:
            source = inspect.getsource(importlib.import_module(name))
        except Exception:  # absent in this Python, or C-only
            continue
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 40 or node.end_lineno - node.lineno > 60:
                continue
            # the def line(s) up to the body's first statement, decorators left out
            seg = "\n".join(lines[node.lineno - 1: node.body[0].lineno - 1])
            header = textwrap.dedent(seg).rstrip()
            if len(header) > 300 or not header.startswith("def ") or not header.endswith(":"):
                continue
            out.append((name, node.name, header, doc.strip()))
    return tuple(sorted(set(out)))


def _code(rng: random.Random) -> str:
    # function completion from a signature and docstring, as humaneval asks: a first round that also asked for
    # prose ("write a function that ...", "implement and explain") lowered humaneval tau 1.58 -> 1.48 (2026-12-03)
    funcs = stdlib_functions()
    module, fn, header, doc = funcs[rng.randrange(len(funcs))]
    doc = textwrap.indent(doc, "    ").lstrip()
    ask = rng.choice(("Complete the following Python function.", "Complete the following Python code.",
                      f"Complete this function from a module like `{module}`. Return the whole function."))
    return f'{ask}\n\n```python\n{header}\n    """{doc}\n    """\n```'


TOPICS = ("a rainy day in a small town", "learning to ride a bicycle", "the first day at a new job", "a lost cat",
          "moving to another country", "a night market", "an old lighthouse", "a friendship between neighbours",
          "saving energy at home", "a weekend hiking trip", "a school science fair", "a family recipe",
          "working from home", "a power cut in winter", "starting a vegetable garden", "a long train journey",
          "learning a second language", "a community library", "adopting a rescue dog", "a surprise birthday party",
          "a city without cars", "the last day of summer", "a broken phone", "running a first marathon",
          "a village festival", "planning a budget", "a snowstorm", "volunteering at a shelter",
          "a robot that learns to cook", "an astronaut's first night in orbit")
FORMS = ("short story", "poem", "blog post", "persuasive essay", "product description", "limerick",
         "speech", "diary entry", "news report", "letter to a friend", "haiku sequence", "dialogue")
ROLES = ("a travel guide", "a chef", "a personal trainer", "a museum curator", "a detective", "a career coach",
         "a librarian", "a ship captain", "a nurse", "a software architect", "a gardener", "a history teacher")
CONCEPTS = ("photosynthesis", "compound interest", "how vaccines work", "the water cycle", "supply and demand",
            "how a CPU executes instructions", "why the sky is blue", "plate tectonics", "machine learning",
            "the greenhouse effect", "how bridges carry loads", "the immune system", "inflation",
            "how the internet routes packets", "natural selection", "the Pythagorean theorem", "black holes",
            "how batteries store energy", "the separation of powers", "opportunity cost", "DNA replication",
            "how airplanes fly", "probability", "the scientific method", "public-key cryptography")
AUDIENCES = ("a ten-year-old", "a high-school student", "a busy manager", "a retired teacher", "a new employee")


def _chat(rng: random.Random) -> str:
    topic, form, role = rng.choice(TOPICS), rng.choice(FORMS), rng.choice(ROLES)
    concept, audience = rng.choice(CONCEPTS), rng.choice(AUDIENCES)
    n = rng.randint(3, 6)
    templates = (
        f"Write a {form} about {topic}.",
        f"Pretend you are {role}. Give {audience} {n} practical tips for {topic}.",
        f"Explain {concept} to {audience} in simple terms, with one example.",
        f"Compose a polite email to a colleague asking for feedback on a report about {concept}.",
        f"Give me {n} ideas for a {form} about {topic}, one sentence each.",
        f"Compare two ways of teaching {concept} to {audience}. Which would you choose and why?",
        f"Summarise the pros and cons of {topic} in a short table, then give a one-paragraph conclusion.",
        f"As {role}, describe your typical day in about {n * 30} words.",
        f"Rewrite this sentence to sound more formal: 'hey, we gotta talk about {topic} asap.'",
        f"What are {n} common misconceptions about {concept}? Correct each one briefly.",
    )
    return rng.choice(templates)


MAKERS = {"proc-math": _math, "proc-code": _code, "proc-chat": _chat}


def prompt(source: str, index: int) -> str:
    """The index-th prompt of a procedural source (deterministic)."""
    return MAKERS[source](random.Random(f"{source}:{index}"))


def distinct(source: str, count: int) -> list[tuple[str, str, str]]:
    """The first `count` distinct prompts of a source, as (id, source, prompt); ids keep their indices."""
    seen, out, i = set(), [], 0
    while len(out) < count and i < 50 * count:
        text = prompt(source, i)
        if text not in seen:
            seen.add(text)
            out.append((f"{source}-{i}", source, text))
        i += 1
    return out


def rows(sources: tuple[str, ...] = SOURCES, per_source: int = PER_SOURCE) -> list[tuple[str, str, str]]:
    """(id, source, prompt), interleaved over sources like the file-based pool."""
    per = [distinct(s, per_source) for s in sources]
    return [r[i] for i in range(max(map(len, per), default=0)) for r in per if i < len(r)]
