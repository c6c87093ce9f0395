"""Every result file the docs cite exists (issue 53): README.md, benchmarks/README.md and docs/
name files under benchmarks/results/ (``results/…`` from benchmarks/README.md, ``benchmarks/results/…``
elsewhere), with ``{a,b}`` and ``{1..4}`` standing for several and ``*`` for any; a name with an
``N`` placeholder (``seedN``, ``-sN``) is a pattern the command writes, not a kept file."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
CITE = re.compile(r"(?:benchmarks/)?results/[A-Za-z0-9_.{}*,/-]+")
PLACEHOLDER = re.compile(r"(seed|-s|\})N\b|N-")


def expand(name: str) -> list[str]:
    """``a{1..3}b`` and ``a{x,y}b`` expanded (every combination)."""
    parts = re.split(r"(\{[^}]*\})", name)
    options = []
    for p in parts:
        if p.startswith("{") and p.endswith("}"):
            inner = p[1:-1]
            m = re.fullmatch(r"(\d+)\.\.(\d+)", inner)
            options.append([str(i) for i in range(int(m[1]), int(m[2]) + 1)] if m else inner.split(","))
        else:
            options.append([p])
    return ["".join(c) for c in itertools.product(*options)]


def citations(text: str) -> set[str]:
    """The paths under benchmarks/results/ a text cites (relative to that folder)."""
    out = set()
    for m in CITE.finditer(text):
        rel = m.group(0).split("results/", 1)[1].rstrip(".,")
        if rel and not PLACEHOLDER.search(rel):
            out.update(expand(rel))
    return out


def missing(root: Path, docs: list[Path]) -> list[str]:
    results = root / "benchmarks" / "results"
    gone = []
    for doc in docs:
        for rel in sorted(citations(doc.read_text())):
            found = list(results.glob(rel)) if "*" in rel else [results / rel] if (results / rel).exists() else []
            if not found:
                gone.append(f"{doc.relative_to(root)}: results/{rel}")
    return gone


def docs_of(root: Path) -> list[Path]:
    return [root / "README.md", root / "benchmarks" / "README.md", *sorted((root / "docs").rglob("*.md"))]


def test_every_result_file_the_docs_cite_exists() -> None:
    docs = docs_of(ROOT)
    assert sum(len(citations(d.read_text())) for d in docs) >= 20  # the parser finds the citations
    assert missing(ROOT, docs) == []


def test_the_check_reads_braces_and_globs_and_names_a_missing_file(tmp_path: Path) -> None:
    assert expand("x-seed{1..3}-{a,b}.json") == ["x-seed1-a.json", "x-seed1-b.json", "x-seed2-a.json",
                                                 "x-seed2-b.json", "x-seed3-a.json", "x-seed3-b.json"]
    assert citations("see `results/a-seedN.json` and `results/rl-x-{p,d}N-seedN.json`") == set()
    (tmp_path / "benchmarks" / "results" / "sub").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    for name in ("a-seed1.json", "a-seed2.json", "sub/c-s56.json"):
        (tmp_path / "benchmarks" / "results" / name).write_text("{}")
    (tmp_path / "README.md").write_text("`benchmarks/results/a-seed{1..3}.json`, results/sub/c-s5*.json.")
    (tmp_path / "benchmarks" / "README.md").write_text("![x](results/sub/c-s56.json) and results/sub/")
    assert missing(tmp_path, docs_of(tmp_path)) == ["README.md: results/a-seed3.json"]
