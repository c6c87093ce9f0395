"""The dashboard files without a server: schema, layout, variables, metric coverage, and the
Grafana provisioning that loads them."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from actuator.metrics import Metrics
from dash import (
    DASHBOARD_DIR,
    DASHBOARD_FILES,
    REPO,
    SCHEMA,
    BUILTINS,
    all_expressions,
    expressions,
    iter_panels,
    load,
    parse_variable_query,
    used_variables,
    variables,
)

def _validator():  # type: ignore[no-untyped-def]
    try:
        import jsonschema_rs
    except ImportError:  # pragma: no cover
        pytest.fail("jsonschema-rs is missing: pip install jsonschema-rs (the [test] extra brings it with schemathesis)")
    return jsonschema_rs.validator_for(json.loads(SCHEMA.read_text()))


PROVISIONING = REPO / "dashboards" / "grafana" / "provisioning"
EXPECTED = {"actuator-runs": "Actuator — runs", "actuator-service": "Actuator — service"}


def test_the_two_dashboards_exist() -> None:
    assert {p.stem: load(p)["title"] for p in DASHBOARD_FILES} == EXPECTED


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=[p.stem for p in DASHBOARD_FILES])
def test_dashboard_matches_schema(path) -> None:  # type: ignore[no-untyped-def]
    validator = _validator()
    errors = [f"{'/'.join(map(str, e.instance_path))}: {e.message[:300]}" for e in validator.iter_errors(load(path))]
    assert not errors, "\n".join(errors)


def test_schema_rejects_a_broken_dashboard() -> None:
    validator = _validator()
    d = load(DASHBOARD_FILES[0])
    target = d["panels"][0]["targets"][0]
    target["exp"] = target.pop("expr")  # a typo Grafana would silently ignore
    assert not validator.is_valid(d)


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=[p.stem for p in DASHBOARD_FILES])
def test_layout_ids_and_variables(path) -> None:  # type: ignore[no-untyped-def]
    d = load(path)
    panels = list(iter_panels(d["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, f"{p['title']} overflows the 24-column grid"
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), f"{p['title']}: refIds must be unique"
    # no two panels overlap
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    defined = {v["name"] for v in d["templating"]["list"]} | set(BUILTINS)
    text = json.dumps(d)
    assert used_variables(text) <= defined, f"undefined variables: {used_variables(text) - defined}"
    for p in panels:
        if p.get("repeat"):
            assert p["repeat"] in defined
    for v in variables(path):
        parse_variable_query(v.query)  # label_values(...) or query_result(...)
    assert expressions(path), "a dashboard without queries"


def test_runs_dashboard_has_run_picker_and_annotations() -> None:
    d = load(DASHBOARD_DIR / "actuator-runs.json")
    run = next(v for v in d["templating"]["list"] if v["name"] == "run")
    assert run["type"] == "query" and not run.get("multi") and "actuator_run_state" in run["definition"]
    annotations = {a["name"] for a in d["annotations"]["list"] if "expr" in a}
    assert {"Decisions", "Guardrail breaches"} <= annotations
    # every run-scoped query of the runs dashboard is scoped to the picked run (or all running runs)
    for e in expressions(DASHBOARD_DIR / "actuator-runs.json"):
        assert 'run="$run"' in e.expr or 'state="running"' in e.expr, e.id


def test_every_metric_is_on_a_dashboard() -> None:
    text = "\n".join(e.expr for e in all_expressions())
    names = set()
    for obj in vars(Metrics()).values():
        if hasattr(obj, "_type"):
            names.add(obj._name + ("_total" if obj._type == "counter" else ""))
    missing = {n for n in names if not re.search(rf"\b{n}(_bucket|_count|_sum)?\b", text)}
    assert not missing, f"metrics no panel shows: {sorted(missing)}"


def test_grafana_provisioning() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    assert ds["apiVersion"] == 1
    [prom] = ds["datasources"]
    assert prom["type"] == "prometheus" and prom["isDefault"] is True
    dash = yaml.safe_load((PROVISIONING / "dashboards" / "actuator.yml").read_text())
    [provider] = dash["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
