"""Reading the dashboards as Grafana would: every PromQL expression (panel targets, annotations,
template variable queries) and the substitution of Grafana's variables."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "dashboards" / "grafana" / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))
SCHEMA = REPO / "dashboards" / "schema" / "dashboard.schema.json"

# What Grafana puts in place of its built-in interval variables, for a short test run with a 1 s
# scrape interval: $__rate_interval spans many scrapes, $__interval a few.
BUILTINS = {"__rate_interval": "20s", "__interval": "5s", "__range": "5m", "__range_s": "300", "__interval_ms": "5000"}

_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))|\[\[(\w+)\]\]")


@dataclass(frozen=True)
class Expr:
    dashboard: str  # file stem
    where: str  # "panel <title> / <refId>" or "annotation <name>"
    expr: str
    instant: bool
    panel_id: int | None = None
    repeat: str | None = None

    @property
    def id(self) -> str:
        return f"{self.dashboard}: {self.where}"


@dataclass(frozen=True)
class Variable:
    dashboard: str
    name: str
    query: str
    multi: bool


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def iter_panels(panels: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels") or [])


def expressions(path: Path) -> list[Expr]:
    """Every ``expr`` of the dashboard: panel targets (rows included) and annotations."""
    d, stem = load(path), path.stem
    out: list[Expr] = []
    for p in iter_panels(d.get("panels", [])):
        for t in p.get("targets") or []:
            if "expr" in t:
                out.append(Expr(stem, f"panel {p['title']!r} / {t['refId']}", t["expr"], bool(t.get("instant")),
                                p["id"], p.get("repeat")))
    for a in d.get("annotations", {}).get("list", []):
        if "expr" in a:
            out.append(Expr(stem, f"annotation {a['name']!r}", a["expr"], False))
    # Nothing may hide elsewhere: count every "expr" key anywhere in the document.
    assert len(out) == json.dumps(d).count('"expr":'), f"{path.name}: an expr outside targets/annotations"
    return out


def variables(path: Path) -> list[Variable]:
    out = []
    for v in load(path).get("templating", {}).get("list", []):
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        out.append(Variable(path.stem, v["name"], q, bool(v.get("multi") or v.get("includeAll"))))
    return out


def all_expressions() -> list[Expr]:
    return [e for f in DASHBOARD_FILES for e in expressions(f)]


def all_variables() -> list[Variable]:
    return [v for f in DASHBOARD_FILES for v in variables(f)]


def used_variables(text: str) -> set[str]:
    return {a or b or c for a, b, c in _VAR.findall(text)}


def regex_value(values: list[str]) -> str:
    """A multi-value / All selection as Grafana's Prometheus datasource writes it inside
    ``=~"..."``: regex-escaped, then backslashes escaped for the PromQL string."""
    return "|".join(re.escape(v).replace("\\", "\\\\") for v in values)


def substitute(text: str, values: dict[str, str]) -> str:
    """Replace ``$name``, ``${name}``, ``${name:fmt}`` and ``[[name]]``; fail on an unknown one."""
    merged = {**BUILTINS, **values}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in merged:
            raise KeyError(f"no value for ${name} in {text!r}")
        return merged[name]

    return _VAR.sub(repl, text)


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.+)\)\s*$", re.S)


def parse_variable_query(query: str) -> tuple[str, str | None, str | None]:
    """("label_values", match, label) or ("query_result", expr, None)."""
    m = _LABEL_VALUES.match(query)
    if m:
        return "label_values", m.group("match"), m.group("label")
    m = _QUERY_RESULT.match(query)
    if m:
        return "query_result", m.group("expr"), None
    raise ValueError(f"unsupported variable query {query!r}: use label_values(...) or query_result(...)")
