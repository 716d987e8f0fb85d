"""Write benchmarks/workloads/json-extract.jsonl: field extraction into a given JSON schema (structured outputs).

Each line is `{"turns": [prompt], "response_format": {...}}`: a short paragraph about a person, a product or an
event, and the OpenAI json_schema response format its fields go into. Deterministic (seeded), so every run of the
benchmark sends the same requests.

    python benchmarks/make_json_workload.py [--n 36] [--out benchmarks/workloads/json-extract.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FIRST = ["Maria", "James", "Aiko", "Liam", "Fatima", "Noah", "Elena", "Ravi", "Sofia", "Kwame", "Ingrid", "Mateo"]
LAST = ["Lopez", "Okafor", "Tanaka", "Novak", "Haddad", "Schmidt", "Rossi", "Patel", "Silva", "Mensah", "Berg"]
CITIES = ["Madrid", "Lagos", "Osaka", "Prague", "Beirut", "Hamburg", "Turin", "Pune", "Porto", "Accra", "Bergen"]
JOBS = ["software engineer", "nurse", "architect", "teacher", "chef", "data analyst", "pilot", "pharmacist"]
PRODUCTS = [("UltraBlend 500", "blender"), ("TrailMax Pro", "hiking boot"), ("SoundWave X2", "headphones"),
            ("AquaPure Mini", "water filter"), ("LumaDesk 3", "desk lamp"), ("CoreBook Air", "laptop")]
EVENTS = ["PyData meetup", "jazz festival", "charity run", "book fair", "robotics workshop", "food market"]
MONTHS = ["January", "March", "April", "June", "September", "October", "November"]

PERSON = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "city", "occupation", "email"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                         "occupation": {"type": "string"}, "email": {"type": "string"}}}
PRODUCT = {"type": "object", "additionalProperties": False,
           "required": ["product", "category", "price_usd", "in_stock", "rating"],
           "properties": {"product": {"type": "string"}, "category": {"type": "string"},
                          "price_usd": {"type": "number"}, "in_stock": {"type": "boolean"},
                          "rating": {"type": "number"}}}
EVENT = {"type": "object", "additionalProperties": False,
         "required": ["event", "city", "month", "day", "attendees", "free_entry"],
         "properties": {"event": {"type": "string"}, "city": {"type": "string"},
                        "month": {"type": "string"}, "day": {"type": "integer"},
                        "attendees": {"type": "integer"}, "free_entry": {"type": "boolean"}}}


def person(r: random.Random) -> tuple[str, dict]:
    first, last, city, job = r.choice(FIRST), r.choice(LAST), r.choice(CITIES), r.choice(JOBS)
    age = r.randint(22, 67)
    text = (f"{first} {last} is a {age}-year-old {job} who lives in {city}. Colleagues describe {first} as "
            f"patient and precise. You can reach {first} at {first.lower()}.{last.lower()}@example.com.")
    return text, PERSON


def product(r: random.Random) -> tuple[str, dict]:
    name, cat = r.choice(PRODUCTS)
    price = r.choice([19.99, 49.5, 89.0, 129.99, 249.0, 399.95])
    stock = r.random() < 0.6
    rating = round(r.uniform(3.0, 5.0), 1)
    text = (f"The {name} is a {cat} that sells for ${price}. Reviewers rate it {rating} out of 5. "
            f"It is currently {'in stock' if stock else 'sold out'} at most retailers.")
    return text, PRODUCT


def event(r: random.Random) -> tuple[str, dict]:
    ev, city, month = r.choice(EVENTS), r.choice(CITIES), r.choice(MONTHS)
    day, people, free = r.randint(1, 28), r.choice([40, 120, 350, 800, 2500]), r.random() < 0.5
    text = (f"The {city} {ev} takes place on {month} {day}. Organisers expect about {people} attendees, and "
            f"entry is {'free' if free else 'ticketed'}.")
    return text, EVENT


def build(n: int, seed: int = 0) -> list[dict]:
    r = random.Random(seed)
    makers = [person, product, event]
    rows = []
    for i in range(n):
        text, schema = makers[i % 3](r)
        prompt = ("Extract the information from the paragraph below into a JSON object with the fields "
                  f"{', '.join(schema['required'])}.\n\nParagraph: {text}")
        rows.append({"turns": [prompt], "response_format": {
            "type": "json_schema", "json_schema": {"name": makers[i % 3].__name__, "schema": schema}}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=36)
    ap.add_argument("--out", default=str(Path(__file__).parent / "workloads" / "json-extract.jsonl"))
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in build(args.n)))
    print(f"wrote {args.n} prompts to {out}")


if __name__ == "__main__":
    main()
