"""Issue 52: a knob and a probe each added in one file (tests/agents/toy_weight_decay.py,
toy_weight_norm.py) plus a docs row, registered in the agent's process only, drive a real
``Trainer.train()`` against the real service in another process: the registration carries their
catalogue entries (``RunCreate.catalogue``), the service validates the run's policy with them and
keeps them with the policy version (a restarted service reads it again)."""

from __future__ import annotations

import importlib
import sys

import httpx
import pytest

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.catalogue import KNOBS, PROBES
from actuator.schemas import CatalogueKnob, CatalogueProbe, CatalogueSpec

from agent_helpers import Lockstep, make_trainer
from catalogue_agreement import DOCS, PROBES_DOCS, disagreements, probe_class_disagreements

POLICY = {
    "name": "toy-norm",
    "probes": [{"name": "weight_norm", "every": 2}],
    # the norm of the tiny model's weights is far above 1: more weight decay
    "controllers": [{"name": "hold-norm", "probe": "weight_norm", "knob": "weight_decay", "setpoint": 1.0,
                     "kp": 0.05, "direction": "reverse"}],
}
KNOB = {"name": "weight_decay", "value": 0.1, "min": 0.0, "max": 0.5, "scale": "linear", "max_step": 0.05}


@pytest.fixture
def toys():
    """The toy modules imported (registered) for one test, and their registrations removed after."""
    from actuator.agents import knobs
    from actuator.agents.probes import _registry

    modules = [importlib.import_module(name) for name in ("toy_weight_decay", "toy_weight_norm")]
    try:
        yield modules
    finally:
        KNOBS.pop("weight_decay", None)
        knobs._REGISTRY.pop("weight_decay", None)
        PROBES.pop("weight_norm", None)
        _registry._REGISTRY.pop("weight_norm", None)
        for module in ("toy_weight_decay", "toy_weight_norm"):
            sys.modules.pop(module, None)


def _declared() -> dict:
    knobs, probes = CatalogueSpec.travelling().knobs, CatalogueSpec.travelling().probes
    return {"knobs": [k.model_dump(mode="json") for k in knobs], "probes": [p.model_dump(mode="json") for p in probes]}


def test_a_toy_knob_and_probe_drive_a_run_on_a_service_in_another_process(tmp_path, char_tokenizer, sqlite_service,
                                                                          toys):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=12, weight_decay=0.1)
    cb = ActuatorCallback(POLICY, connection=sqlite_service.url, reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(Lockstep(cb))  # each answer taken at the boundary after its reading
    trainer.train()

    assert cb.session.run_id is not None, "the service accepted the run"
    # the probe was built for the policy by its registration, and its readings reached the service
    assert [p.name for p in cb.session.suite.probes] == ["weight_norm"]
    norms = [h["probes"]["weight_norm"] for h in cb.session.history if "weight_norm" in h["probes"]]
    assert len(norms) >= 5 and all(n > 1.0 for n in norms)
    state = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert state["latest_probes"]["weight_norm"] == pytest.approx(norms[-1])
    # the service decided on the knob, the agent applied each decision to the optimizer
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    assert len(decisions) >= 2 and {d["knob"] for d in decisions} == {"weight_decay"}
    ordered = [d["new_value"] for d in decisions]  # norm above its setpoint, reverse acting: decay rises
    assert all(0.1 < a < b <= 0.5 for a, b in zip(ordered, ordered[1:])), ordered
    applied = [e["applied"] for e in cb.session.applied]
    assert applied == pytest.approx([d["new_value"] for d in decisions][:len(applied)]) and len(applied) >= 2
    assert trainer.optimizer.param_groups[0]["weight_decay"] == pytest.approx(applied[-1])
    assert trainer.optimizer.param_groups[1]["weight_decay"] == 0.0  # the no-decay group untouched
    # the policy version keeps what it was accepted with: a service restarted from the same
    # database (no engine cached, nothing registered in its process) still reads and runs it
    sqlite_service.stop()
    sqlite_service.start()
    page = httpx.get(f"{sqlite_service.url}/ui/runs/{cb.session.run_id}")  # the run's engine, built again
    assert page.status_code == 200 and "hold-norm" in page.text


def test_the_service_refuses_a_policy_naming_them_without_the_catalogue_and_bad_entries(sqlite_service, toys):
    url = f"{sqlite_service.url}/v1/runs"
    body = {"name": "r", "policy": POLICY, "knobs": [KNOB]}
    refused = httpx.post(url, json=body)
    assert refused.status_code == 422 and "unknown knob 'weight_decay'" in refused.text
    # a bad entry: 422 naming the field, nothing stored
    bad = _declared()
    bad["knobs"][0]["max"] = -1.0
    refused = httpx.post(url, json={**body, "catalogue": bad})
    assert refused.status_code == 422
    assert [e["loc"] for e in refused.json()["detail"]["errors"]] == ["body.catalogue.knobs.0.max"], refused.json()
    # a name the service ships, declared otherwise: 422 at that entry
    lr = CatalogueKnob.of(KNOBS["learning_rate"]).model_copy(update={"max_step": 0.1}).model_dump(mode="json")
    refused = httpx.post(url, json={**body, "catalogue": {**_declared(), "knobs": [*_declared()["knobs"], lr]}})
    assert refused.status_code == 422
    assert [e["loc"] for e in refused.json()["detail"]["errors"]] == ["body.catalogue.knobs.1"], refused.json()
    assert httpx.get(url).json() == [] and httpx.get(f"{sqlite_service.url}/v1/policies").json() == []

    created = httpx.post(url, json={**body, "catalogue": _declared()})
    assert created.status_code == 201, created.text
    stored = httpx.get(f"{sqlite_service.url}/v1/policies/toy-norm").json()
    assert stored["document"]["controllers"][0]["knob"] == "weight_decay"


def test_the_toys_need_their_docs_rows_and_their_registration(toys):
    from actuator.agents.knobs import registered_setters
    from actuator.agents.probes import registered

    weight_decay, weight_norm = toys
    docs = DOCS.read_text()
    found = disagreements(KNOBS, PROBES, registered_setters(), docs)
    assert found == ["knob weight_decay: missing from ['docs']", "probe weight_norm: missing from the docs"]
    knob_table = docs.split("\n\nSetters are named")[0]
    with_rows = docs.replace(knob_table, knob_table + "\n" + weight_decay.DOCS_ROW.replace(
        "`WeightDecayKnob", "`../../tests/agents/WeightDecayKnob"))
    probe_row = next(line for line in docs.splitlines() if line.startswith("| `compression.params` |"))
    with_rows = with_rows.replace(probe_row, probe_row + "\n" + weight_norm.DOCS_ROW)
    setters = {**registered_setters(), "weight_decay": "actuator.agents.../../tests/agents/WeightDecayKnob(optimizer)"}
    assert disagreements(KNOBS, PROBES, setters, with_rows) == []

    keys = {n: r.keys for n, r in registered().items()}
    classes = {n: r.cls.__name__ for n, r in registered().items()}
    probes_docs = PROBES_DOCS.read_text()
    assert probe_class_disagreements(keys, classes, probes_docs) == ["probe class WeightNorm: missing from the probes docs"]
    last = next(line for line in probes_docs.splitlines() if line.startswith("| `DraftAcceptance("))
    with_row = probes_docs.replace(last, last + "\n" + weight_norm.PROBES_DOCS_ROW)
    assert probe_class_disagreements(keys, classes, with_row) == []
    # and the probe's entries travel: what the agent sends with a registration
    assert CatalogueSpec.travelling() == CatalogueSpec(knobs=[CatalogueKnob.of(KNOBS["weight_decay"])],
                                                      probes=[CatalogueProbe.of(PROBES["weight_norm"])])
