"""Generator of the shipped synthetic multi-hop set (official HotpotQA format).

A seeded random "world" of invented people, organisations, cities, countries and rivers, one
Wikipedia-like paragraph per entity, and questions that need two paragraphs:

* bridge: reach an entity through another ("In which city was the founder of X born?");
* comparison: compare two entities ("Which was founded first, X or Y?", yes/no questions).

Each record has two gold paragraphs and distractor paragraphs about other entities of the same
kinds, shuffled together, like HotpotQA's distractor setting. ``level`` says how much the
question asks: ``easy`` yes/no comparisons, ``medium`` other comparisons, ``hard`` bridges.
The entities are invented, so a model cannot answer from memory; it must read.

Regenerate the shipped file (deterministic for a seed)::

    python -m actuator.agents.probes._synthetic            # writes agents/probes/data/
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["generate_synthetic_hotpotqa", "write_synthetic_hotpotqa"]

_ONSETS = ["b", "br", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "st", "gr", "dr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou"]
_CODAS = ["", "", "n", "r", "l", "s", "m", "th", "nd", "rk"]

_PROFESSIONS = [
    "architect", "astronomer", "botanist", "cartographer", "chemist",
    "composer", "engineer", "novelist", "painter", "sculptor",
]
_WORKS = [
    "a series of {adj} bridges", "studies of {adj} comets", "{adj} river maps",
    "a cycle of {adj} string quartets", "a trilogy of {adj} novels", "{adj} bronze figures",
    "a survey of {adj} mosses", "{adj} glass facades", "a method for {adj} dyes",
    "{adj} harbour paintings",
]
_ADJECTIVES = ["amber", "silent", "northern", "copper", "winding", "pale", "restless", "hollow", "distant", "crimson"]
_ORG_KINDS = [
    ("Works", "metalworking company"), ("Records", "record label"), ("Press", "publishing house"),
    ("Foundry", "bell foundry"), ("Shipping", "shipping company"), ("Textiles", "textile manufacturer"),
    ("Laboratories", "research laboratory"), ("Brewery", "brewery"),
]


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


@dataclass
class _Person:
    first: str
    last: str
    profession: str
    work: str
    year: int
    city: "_City"
    lives: "_City"
    since: int

    @property
    def title(self) -> str:
        return f"{self.first} {self.last}"

    def sentences(self) -> list[str]:
        return [
            f"{self.title} is {_a(self.profession)} known for {self.work}.",
            f" {self.last} was born in {self.year} in {self.city.title}.",
            f" Since {self.since}, {self.last} has lived and worked in {self.lives.title}.",
        ]


@dataclass
class _City:
    title: str
    country: str
    river: str
    population: int

    def sentences(self) -> list[str]:
        return [
            f"{self.title} is a city in {self.country}.",
            f" It lies on the {self.river} River.",
            f" {self.title} has a population of about {self.population:,} people.",
        ]


@dataclass
class _Org:
    title: str
    kind: str
    year: int
    founder: _Person
    hq: _City

    def sentences(self) -> list[str]:
        return [
            f"{self.title} is {_a(self.kind)} founded in {self.year}.",
            f" It was established by {self.founder.title}.",
            f" Its headquarters are in {self.hq.title}.",
        ]


class _World:
    def __init__(self, rng: random.Random, n_people: int = 120, n_cities: int = 40, n_orgs: int = 60) -> None:
        used: set[str] = set()

        def fresh(make) -> str:  # noqa: ANN001 - a tiny local helper
            while True:
                name = make()
                if name not in used and name.lower() not in ("a", "an", "the"):
                    used.add(name)
                    return name

        countries = [fresh(lambda: _word(rng, 2) + rng.choice(["ia", "land", "ora", "stan"])) for _ in range(8)]
        rivers = [fresh(lambda: _word(rng, 1)) for _ in range(14)]
        self.cities = [
            _City(fresh(lambda: _word(rng, 2) + rng.choice(["", "holt", "burg", "mouth", "ford"])),
                  rng.choice(countries), rng.choice(rivers), rng.randrange(20, 2000) * 1000)
            for _ in range(n_cities)
        ]
        self.people = []
        for _ in range(n_people):
            first, last = fresh(lambda: _word(rng, 2)), fresh(lambda: _word(rng, rng.choice([2, 3])))
            born, lives = rng.sample(self.cities, 2)
            year = rng.randrange(1850, 1990)
            work = rng.choice(_WORKS).format(adj=rng.choice(_ADJECTIVES))
            self.people.append(
                _Person(first, last, rng.choice(_PROFESSIONS), work, year, born, lives, year + rng.randrange(20, 35))
            )
        founders = rng.sample(self.people, n_orgs)  # one organisation per founder: no ambiguity
        self.orgs = []
        for founder in founders:
            suffix, kind = rng.choice(_ORG_KINDS)
            self.orgs.append(
                _Org(fresh(lambda suffix=suffix: f"{_word(rng, 2)} {suffix}"), kind,
                     founder.year + rng.randrange(22, 50), founder, rng.choice(self.cities))
            )
        self.by_title = {e.title: e for e in [*self.cities, *self.people, *self.orgs]}


def _bridge(rng: random.Random, world: _World) -> tuple[str, str, list[tuple[str, int]]]:
    kind = rng.randrange(6)
    org = rng.choice(world.orgs)
    person = org.founder
    if kind == 0:
        return f"In which city was the founder of {org.title} born?", person.city.title, [(org.title, 1), (person.title, 1)]
    if kind == 1:
        return (f"What is the profession of the person who established {org.title}?", person.profession,
                [(org.title, 1), (person.title, 0)])
    if kind == 2:
        return f"In what year was the founder of {org.title} born?", str(person.year), [(org.title, 1), (person.title, 1)]
    if kind == 3:
        person = rng.choice(world.people)
        return (f"In which country was {person.title} born?", person.city.country,
                [(person.title, 1), (person.city.title, 0)])
    if kind == 4:
        return (f"On which river lies the city where {org.title} has its headquarters?", f"{org.hq.river} River",
                [(org.title, 2), (org.hq.title, 1)])
    return f"In which country is {org.title} headquartered?", org.hq.country, [(org.title, 2), (org.hq.title, 0)]


def _comparison(rng: random.Random, world: _World) -> tuple[str, str, list[tuple[str, int]], str]:
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.sample(world.orgs, 2)
        while a.year == b.year:
            a, b = rng.sample(world.orgs, 2)
        first = a if a.year < b.year else b
        return f"Which was founded first, {a.title} or {b.title}?", first.title, [(a.title, 0), (b.title, 0)], "medium"
    if kind == 1:
        a, b = rng.sample(world.people, 2)
        while a.year == b.year:
            a, b = rng.sample(world.people, 2)
        first = a if a.year < b.year else b
        return f"Who was born earlier, {a.title} or {b.title}?", first.title, [(a.title, 1), (b.title, 1)], "medium"
    if kind == 2:
        a = rng.choice(world.people)
        same = rng.random() < 0.5
        pool = [p for p in world.people if p is not a and (p.profession == a.profession) == same]
        b = rng.choice(pool)
        question = f"Are {a.title} and {b.title} both {a.profession}s?"
        return question, "yes" if same else "no", [(a.title, 0), (b.title, 0)], "easy"
    if kind == 3:
        a, b = rng.sample(world.cities, 2)
        larger = a if a.population > b.population else b
        return (f"Which city has a larger population, {a.title} or {b.title}?", larger.title,
                [(a.title, 2), (b.title, 2)], "medium")
    a = rng.choice(world.cities)
    same = rng.random() < 0.5
    pool = [c for c in world.cities if c is not a and (c.country == a.country) == same] or [
        c for c in world.cities if c is not a
    ]
    b = rng.choice(pool)
    answer = "yes" if a.country == b.country else "no"
    return f"Are {a.title} and {b.title} in the same country?", answer, [(a.title, 0), (b.title, 0)], "easy"


def _distractors(rng: random.Random, world: _World, gold: list[str], count: int) -> list[str]:
    """Other entities, half of the same kinds as the gold paragraphs (the confusable ones)."""
    kinds = {type(world.by_title[t]) for t in gold}
    same_kind = [t for t, e in world.by_title.items() if type(e) in kinds and t not in gold]
    chosen = rng.sample(same_kind, min(count // 2, len(same_kind)))
    others = [t for t in world.by_title if t not in gold and t not in chosen]
    return chosen + rng.sample(others, count - len(chosen))


def generate_synthetic_hotpotqa(
    n_bridge: int = 40, n_comparison: int = 40, *, seed: int = 0, paragraphs: int = 10
) -> list[dict]:
    """HotpotQA-format records over a synthetic world; deterministic for a given ``seed``."""
    if paragraphs < 2:
        raise ValueError("paragraphs must be >= 2 (two gold paragraphs)")
    rng = random.Random(seed)
    world = _World(rng)
    specs = ["bridge"] * n_bridge + ["comparison"] * n_comparison
    rng.shuffle(specs)
    records: list[dict] = []
    seen_questions: set[str] = set()
    for qtype in specs:
        while True:
            if qtype == "bridge":
                question, answer, facts = _bridge(rng, world)
                level = "hard"
            else:
                question, answer, facts, level = _comparison(rng, world)
            if question not in seen_questions:
                seen_questions.add(question)
                break
        gold = list(dict.fromkeys(title for title, _ in facts))
        titles = gold + _distractors(rng, world, gold, paragraphs - len(gold))
        rng.shuffle(titles)
        records.append(
            {
                "_id": f"{rng.getrandbits(96):024x}",
                "question": question,
                "answer": answer,
                "supporting_facts": [[title, index] for title, index in facts],
                "context": [[title, world.by_title[title].sentences()] for title in titles],
                "type": qtype,
                "level": level,
            }
        )
    return records


def write_synthetic_hotpotqa(path: str | Path, **kwargs: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = generate_synthetic_hotpotqa(**kwargs)
    # One record a line: a readable diff when the generator changes, a third of indent=1's size.
    lines = ",\n".join(json.dumps(record, ensure_ascii=False) for record in records)
    path.write_text(f"[\n{lines}\n]\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    from ._hotpotqa import BUILTIN_HOTPOTQA

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data" / BUILTIN_HOTPOTQA)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bridge", type=int, default=40)
    parser.add_argument("--comparison", type=int, default=40)
    args = parser.parse_args(argv)
    write_synthetic_hotpotqa(args.out, n_bridge=args.bridge, n_comparison=args.comparison, seed=args.seed)


if __name__ == "__main__":
    main()
