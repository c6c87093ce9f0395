"""No function in benchmarks/ above cyclomatic complexity 15 (issue 53; radon's API, run by
``make lint``): the scenario files keep their task, arms and metrics, and what they share (seeds,
files, aggregation, verdicts, plots) lives once in benchmarks/control/contract.py and harness.py."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
LIMIT = 15


def too_complex(root: Path, limit: int = LIMIT) -> list[str]:
    """``path:line name complexity`` of every function or method under ``root`` above ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for block in cc_visit(path.read_text()):
            for b in [block, *getattr(block, "methods", [])]:
                if b.complexity > limit:
                    found.append(f"{path.relative_to(root.parent)}:{b.lineno} {b.name} {b.complexity}")
    return found


def test_no_function_in_benchmarks_is_above_complexity_15() -> None:
    assert too_complex(BENCHMARKS) == []


def test_the_check_finds_a_function_above_the_limit(tmp_path: Path) -> None:
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(16))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(f"def f(x):\n{branches}\n    return -1\n")
    assert too_complex(tmp_path / "pkg") == ["pkg/m.py:1 f 17"]
