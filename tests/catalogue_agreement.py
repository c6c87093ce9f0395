"""The agreement check between the catalogue, the agent's registrations and the docs tables
(docs/reference/knobs-and-probes.md, docs/reference/probes.md): what tests/actuator/test_catalogue.py
asserts, and what the toy knob and probe (tests/agents/test_registry_end_to_end.py) are checked with."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from actuator.catalogue import Knob, Probe

DOCS = Path(__file__).resolve().parents[1] / "docs" / "reference" / "knobs-and-probes.md"
PROBES_DOCS = DOCS.with_name("probes.md")


def _table(text: str, section: str) -> dict[str, list[str]]:
    """The rows of the table under ``## section``, by the name in their first cell."""
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in body.splitlines()
            if line.startswith("| `")]
    return {row[0].strip("`"): row[1:] for row in rows}


def _number(cell: str, value: float) -> float | None:
    """A docs cell ('value / 100', 'max(1, value)', 'ln 1.05', '[−∞, 0]' parts, 'none') as a number."""
    if cell == "none":
        return None
    expr = cell.replace("×", "*").replace("−", "-").replace("∞", "inf")
    expr = re.sub(r"\bln ([\d.]+)", r"ln(\1)", expr)
    return float(eval(expr, {"__builtins__": {}}, {"value": value, "max": max, "ln": math.log, "inf": math.inf}))


def disagreements(knobs: dict[str, Knob], probes: dict[str, Probe], setters: dict[str, str], docs: str) -> list[str]:
    """Every way the catalogue, the registered setters (name -> hint) and the docs tables differ."""
    out: list[str] = []
    knob_rows, probe_rows = _table(docs, "Knobs"), _table(docs, "Probes")
    for name in sorted(set(knobs) | set(setters) | set(knob_rows)):
        where = {"catalogue": name in knobs, "setters": name in setters, "docs": name in knob_rows}
        if not all(where.values()):
            out.append(f"knob {name}: missing from {[w for w, there in where.items() if not there]}")
            continue
        lo, hi, scale, step, setter, _ = knob_rows[name]
        knob = knobs[name]
        for value in (0.5, 3.0):
            spec = knob.spec(value)
            documented = {"min": _number(lo, value), "max": _number(hi, value), "scale": scale,
                          "max_step": _number(step, value)}
            for key, want in documented.items():
                if not (spec[key] == want or (isinstance(want, float) and spec[key] == pytest.approx(want))):
                    out.append(f"knob {name}: docs say {key} {want}, the catalogue {spec[key]} (value {value})")
        if f"actuator.agents.{setter.strip('`')}" != setters[name]:
            out.append(f"knob {name}: docs name the setter {setter}, the registry {setters[name]}")
    for name in sorted(set(probes) | set(probe_rows)):
        if name not in probes or name not in probe_rows:
            out.append(f"probe {name}: missing from {'the docs' if name in probes else 'the catalogue'}")
            continue
        rng, better, drift, source, _ = probe_rows[name]
        probe = probes[name]
        documented = (tuple(_number(c.strip(), 0.0) for c in rng.strip("[]").split(",")),
                      better == "higher", drift == "yes", None if source == "(knob setter)" else source.strip("`"))
        if documented != (probe.range, probe.higher_is_better, probe.drift, probe.source):
            out.append(f"probe {name}: docs say {documented}, the catalogue "
                       f"{(probe.range, probe.higher_is_better, probe.drift, probe.source)}")
    return out




def probe_class_disagreements(registered: dict[str, tuple[str, ...]], classes: dict[str, str], docs: str) -> list[str]:
    """Every way the registered probes (name -> its keys; ``classes``: name -> class name) and the
    table of docs/reference/probes.md (a row per class: `` `Class(args)` ``, then its keys) differ."""
    rows = {}
    for line in docs.split("\n## ", 1)[0].splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0].strip("`").split("(", 1)[0]] = tuple(re.findall(r"`([^`]+)`", cells[1]))
    out = []
    by_class = {classes[name]: keys for name, keys in registered.items()}
    for cls in sorted(set(by_class) | set(rows)):
        if cls not in rows or cls not in by_class:
            out.append(f"probe class {cls}: missing from {'the probes docs' if cls in by_class else 'the registry'}")
        elif set(rows[cls]) != set(by_class[cls]):
            out.append(f"probe class {cls}: docs list keys {sorted(rows[cls])}, the registration {sorted(by_class[cls])}")
    return out
