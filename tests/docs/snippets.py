"""The fenced code blocks of README.md and docs/: where they are and how each is marked.

A block is run or checked by tests/docs/test_doc_snippets.py according to its language, unless
the line just before it is a marker, an HTML comment (invisible on GitHub and in the site):

    <!-- snippet: not-run REASON -->      not run; python must still compile and its actuator
                                          imports resolve, yaml parse, and an `actuator ...` line
                                          of a bash block parse as a command of the CLI
    <!-- snippet: output FILE (...) -->   what a program prints: FILE exists and holds the first
                                          word of every line
    <!-- snippet: paths -->               each line starts with a path that exists
    <!-- snippet: run-by TEST_FILE -->    TEST_FILE exists and reads this document
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Pages other engineers own: their blocks are theirs to mark (see the final report of issue 38).
MARKER = re.compile(r"<!-- snippet: (?P<kind>not-run|output|paths|run-by)(?: (?P<arg>.*?))? -->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.M | re.S)


@dataclass
class Block:
    doc: str  # path from the repository root
    line: int
    lang: str
    body: str
    marker: str | None  # not-run | output | paths | run-by
    arg: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line} ({self.lang or 'no language'})"


def documents() -> list[Path]:
    pages = sorted(DOCS.rglob("*.md"))
    return [ROOT / "README.md", *pages]


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARKER.match(before.strip())
        found.append(Block(str(path.relative_to(ROOT)), line, m["lang"], m["body"],
                           mark["kind"] if mark else None, (mark["arg"] or "") if mark else ""))
    return found


def all_blocks() -> list[Block]:
    return [b for doc in documents() for b in blocks(doc)]
