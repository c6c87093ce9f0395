"""The demo's figures in README and the tutorial are the recorded output of ``make demo``.

``benchmarks/results/demo-output.txt`` is what ``make demo`` printed on a clean clone; its last
table ("side by side") is what README.md and docs/tutorial/first-controlled-run.md quote. A demo
re-run that changes a figure without the pages following (or an edit to a page's table) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "benchmarks" / "results" / "demo-output.txt"
PAGES = [ROOT / "README.md", ROOT / "docs" / "tutorial" / "first-controlled-run.md"]

# page row label -> the demo table's row label (the pages word two rows for readers)
ROWS = {
    "task accuracy (35 words)": "task accuracy (35 words)",
    "general perplexity (held out)": "general perplexity",
    "HotpotQA gold log-prob": "HotpotQA gold log-prob",
    "embedding drift of answers": "embedding drift of answers",
    "KL drift on chat prompts": "KL drift from start",
    "answer KL on control prompts (the budget: 0.1)": "answer KL (control prompts)",
    "seconds per step (both probe every 2 steps)": "seconds per step",
}
NUMBER = re.compile(r"[−-]?\d+(?:\.\d+)?")


def demo_table(text: str) -> dict[str, list[str]]:
    """The last rich table of the demo's output: row label -> its cells (first number of each, as
    printed; empty where the cell is empty). A label wrapped over several lines is joined."""
    block = text[text.rindex("side by side"):]
    rows: dict[str, list[str]] = {}
    label: list[str] = []
    cells: list[str] = []
    for line in block.splitlines():
        if line.startswith(("└", "├")) or (line.startswith("│") and not line.strip("│ ")):
            continue
        if not line.startswith("│"):
            continue
        parts = [p.strip() for p in line.strip().strip("│").split("│")]
        if any(parts[1:]):  # a new row starts with its figures
            if label:
                rows[" ".join(label)] = cells
            label, cells = [parts[0]], [(m.group(0) if (m := NUMBER.search(p)) else "") for p in parts[1:]]
        else:
            label.append(parts[0])
    if label:
        rows[" ".join(label)] = cells
    return rows


def page_table(text: str) -> tuple[str, dict[str, list[str]]]:
    """The page's demo table: its header's first cell and row label -> cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| after ") and "open loop" in line)
    header = lines[start].strip("|").split("|")[0].strip()
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        rows[parts[0]] = [(m.group(0) if (m := NUMBER.search(p)) else "") for p in parts[1:]]
    return header, rows


def same(page: str, demo: str) -> bool:
    """The page's figure is the demo's, rounded to the page's decimals (0 stands for 0.000)."""
    if not page or not demo:
        return page == demo
    p, d = float(page.replace("−", "-")), float(demo.replace("−", "-"))
    decimals = len(page.partition(".")[2])
    return round(d, decimals) == p


def test_demo_output_parses() -> None:
    rows = demo_table(OUTPUT.read_text())
    assert set(ROWS.values()) <= set(rows), sorted(rows)
    assert rows["general perplexity"][0] and len(rows["general perplexity"]) == 3


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_quotes_the_recorded_demo(page: Path) -> None:
    output = OUTPUT.read_text()
    demo = demo_table(output)
    header, rows = page_table(page.read_text())
    steps, lr = re.search(r"(\d+) steps at lr ([\d.e-]+)", output[output.rindex("side by side"):]).groups()
    h_steps, h_lr = re.search(r"after (\d+) steps at lr ([\d.e-]+)", header).groups()
    assert (int(h_steps), float(h_lr)) == (int(steps), float(lr))
    assert rows, f"{page.name}: no demo table found"
    for label, cells in rows.items():
        assert label in ROWS, f"{page.name}: row {label!r} is not a row of the demo's table"
        recorded = demo[ROWS[label]]
        # pages leave the start column empty where the demo prints nothing (seconds per step)
        start = 0 if len(cells) == len(recorded) else len(recorded) - len(cells)
        for page_cell, demo_cell in zip(cells, recorded[start:]):
            assert same(page_cell, demo_cell), f"{page.name}: {label!r}: {page_cell} but the demo printed {demo_cell}"


def test_a_changed_figure_is_caught() -> None:
    """The comparison would notice a stale figure (the regression that motivated this test)."""
    demo = demo_table(OUTPUT.read_text())
    assert same("−1.317", demo["HotpotQA gold log-prob"][0])
    assert not same("−2.434", demo["HotpotQA gold log-prob"][0])
    assert same("0.77", demo["KL drift from start"][1])
    assert not same("8.21", demo["KL drift from start"][1])  # the open loop's figure of the earlier configuration
