"""The laws table (docs/reference/knobs-and-probes.md, "Laws") and the law registry agree: every
registered kind has its row naming its document model, its law and the module that defines the
law, and every row is a registered kind. A law added without its row fails here."""

from __future__ import annotations

import inspect
from pathlib import Path

from actuator.controllers import Registration, registrations
from actuator.policy import ControllerSpec

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "reference" / "knobs-and-probes.md"


def _rows(text: str) -> dict[str, list[str]]:
    body = text.split("## Laws\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines()
            if line.startswith("| `")]
    return {r[0].strip("`"): r for r in rows}


def _module(law: type) -> str:
    """The repository path of the module defining ``law`` (``controllers/pid.py``)."""
    return Path(inspect.getfile(law)).resolve().relative_to(ROOT).as_posix()


def disagreements(regs: list[Registration], text: str) -> list[str]:
    rows = _rows(text)
    out = []
    for reg in regs:
        row = rows.get(reg.kind)
        if row is None:
            out.append(f"kind {reg.kind}: no row in the laws table")
            continue
        want = [f"`{reg.spec.__name__}`", f"`{reg.law.__name__}`", f"`{_module(reg.law)}`"]
        if row[1:4] != want:
            out.append(f"kind {reg.kind}: the row says {row[1:4]}, the registry {want}")
    out += [f"kind {kind}: a row but no registration" for kind in sorted(rows.keys() - {r.kind for r in regs})]
    return out


def test_the_laws_table_lists_every_registered_law() -> None:
    text = DOCS.read_text()
    assert disagreements(registrations(), text) == []
    assert len(_rows(text)) >= 5


def test_a_missing_row_or_a_law_without_one_is_caught() -> None:
    text = DOCS.read_text()
    planted = "\n".join(line for line in text.splitlines() if not line.startswith("| `follow` |"))
    assert disagreements(registrations(), planted) == ["kind follow: no row in the laws table"]
    # a law registered without its row (the toy of tests/plugins, not registered in this process)
    from actuator.controllers import LawBase

    class Toy(ControllerSpec):
        pass

    class ToyLaw(LawBase):
        pass

    toy = Registration("toy", Toy, ToyLaw)  # type: ignore[arg-type]
    assert disagreements([*registrations(), toy], text) == ["kind toy: no row in the laws table"]
    wrong = text.replace("| `SetpointLaw` |", "| `PID` |")
    assert disagreements(registrations(), wrong)[0].startswith("kind setpoint: the row says")
