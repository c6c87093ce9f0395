"""gains auto on the service's side: what the policy language and registration refuse (4xx naming
the field, nothing stored), that the tuned gains live in the run's stored state (a second store,
as after a restart or on another worker, controls with them), and that a run without gains auto
is registered and answered exactly as before."""

from __future__ import annotations

import math

import httpx
import pytest

from actuator.policy import PolicyError, load_policy
from actuator.schemas import ObservationBatch, ObservationCreate, RunCreate
from actuator.store import Store

# The setpoint lies beyond where the step test takes plant() (1.0 -> 1.4): the test runs to its end.
AUTO = {"name": "auto-api", "controllers": [{"name": "hold", "probe": "custom.plant", "knob": "learning_rate",
                                             "setpoint": 1.6, "gains": "auto", "kp": 0.5, "ki": 0.1}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-5, "max": 1e-1, "scale": "log", "max_step": 0.5}]
WINDOW = {"controller": "hold", "knob": "learning_rate", "start": 0, "end": 12, "size": 0.5}


def controller(**fields) -> dict:
    return {**AUTO["controllers"][0], **fields}


@pytest.mark.parametrize(("controllers", "loc"), [
    ([controller(), controller(name="again")], "controllers.1.gains"),  # two on one knob: one step test
    ([controller(), controller(name="beta", knob="kl_beta", direction="reverse")], "controllers.1.gains"),
    ([controller(gains="relative", identify={"size": 0.5})], "controllers.0.identify"),
    ([controller(identify={"size": 0.0})], "controllers.0.identify.size"),
    ([controller(identify={"length": 0})], "controllers.0.identify.length"),
    ([{"name": "m", "kind": "maximize", "probe": "custom.plant", "knob": "learning_rate", "dither": 0.1,
       "gain": 1.0, "gains": "auto"}], "controllers.0.gains"),
    ([{"name": "f", "kind": "follow", "probe": "custom.plant", "knob": "learning_rate",
       "schedule": [[0, 1e-4], [1, 1e-3]], "gains": "auto"}], "controllers.0.gains"),
    ([controller(kp=None)], "controllers.0.kp"),  # the fallback gains are required
])
def test_policy_refuses_naming_the_field(controllers: list[dict], loc: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy({"name": "bad", "controllers": controllers})
    assert loc in [e["loc"] for e in info.value.errors], info.value.errors


def test_auto_policy_validates_with_its_step_test() -> None:
    doc = load_policy({"name": "ok", "controllers": [controller(identify={"size": -0.3, "hold": 2})]})
    spec = doc.controllers[0]
    assert spec.gains == "auto" and spec.identify is not None and spec.identify.size == -0.3
    assert spec.error_span(1.2, None) == 1.2  # the fallback gains are relative
    # a controller without it keeps its document's shape
    assert "identify" not in load_policy(AUTO).controllers[0].model_dump(mode="json")


def test_registration_refuses_bad_windows_and_stores_nothing(module_service) -> None:
    url = module_service.url
    before = len(httpx.get(f"{url}/v1/runs").json())
    plain = {**AUTO, "name": "plain-api", "controllers": [controller(gains="relative")]}
    for policy, window, loc in (
        (AUTO, {**WINDOW, "controller": "nope"}, "body.identification.0.controller"),
        (plain, WINDOW, "body.identification.0.controller"),
        (AUTO, {**WINDOW, "knob": "kl_beta"}, "body.identification.0.knob"),
        (AUTO, {**WINDOW, "end": 0}, "body.identification.0"),
    ):
        r = httpx.post(f"{url}/v1/runs", json={"policy": policy, "knobs": KNOBS, "identification": [window]})
        assert r.status_code == 422, r.text
        assert any(e["loc"].startswith(loc) for e in r.json()["detail"]["errors"]), r.text
    r = httpx.post(f"{url}/v1/policies/validate", json={**AUTO, "controllers": [controller(), controller(name="b")]})
    assert r.status_code in (400, 422) or not r.json().get("valid", True), r.text
    assert "controllers.1.gains" in r.text
    assert len(httpx.get(f"{url}/v1/runs").json()) == before
    assert httpx.get(f"{url}/v1/policies/{AUTO['name']}").status_code == 404


def test_a_run_without_gains_auto_is_unchanged(module_service) -> None:
    body = RunCreate(policy={**AUTO, "name": "plain-run", "controllers": [controller(gains="relative")]}, knobs=KNOBS)
    assert "identification" not in body.model_dump(mode="json")  # what an older service accepts
    url = module_service.url
    run = httpx.post(f"{url}/v1/runs", json=body.model_dump(mode="json")).json()
    assert run["identification"] == []
    auth = {"Authorization": f"Bearer {run['token']}"}
    answers = [httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json={"observations": [
        {"seq": k, "step": k, "probes": {"custom.plant": 1.0}, "knobs": {"learning_rate": 1e-3}}]}).json()
        for k in range(3)]
    assert [a["notices"] for a in answers] == [[], [], []]
    assert answers[-1]["decisions"], "relative gains act from the first observation"
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()
    assert "auto" not in state["controllers"]["hold"]
    kinds = {e["kind"] for e in httpx.get(f"{url}/v1/runs/{run['id']}/events").json()}
    assert not kinds & {"auto_gains", "auto_gains_fallback"}


def plant(steps: range) -> list[ObservationCreate]:
    """A first-order plant (gain 0.8, tau 2) under the step test of WINDOW, then held."""
    out, x = [], 0.0
    for k in range(steps.stop):
        u = 0.5 if 3 <= k < 12 else 0.0
        x = u + (x - u) * math.exp(-0.5)
        if k in steps:
            out.append(ObservationCreate(seq=k, step=k, probes={"custom.plant": 1.0 + 0.8 * x},
                                         knobs={"learning_rate": 1e-3 * math.exp(0.5 if 2 <= k < 11 else 0.0)}))
    return out


def test_tuned_gains_survive_a_restart(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    from actuator.migrate import upgrade  # the schema as the service creates it

    upgrade(url)
    first = Store(url)
    policy = first.create_policy(load_policy(AUTO))
    body = RunCreate(policy=AUTO["name"], knobs=KNOBS, identification=[WINDOW])
    one, _ = first.create_run(body, policy)
    two, _ = first.create_run(body, policy)
    first.ingest(one.id, ObservationBatch(observations=plant(range(0, 13))))
    first.ingest(two.id, ObservationBatch(observations=plant(range(0, 13))))
    state = first.get_run(one.id).controllers["hold"]["auto"]
    assert state["status"] == "tuned" and state["gains"]["gains"] == "absolute" and "samples" not in state
    later = plant(range(13, 16))
    kept = first.ingest(one.id, ObservationBatch(observations=later))
    first.close()
    second = Store(url)  # a new process: no engine, no cache, only what was stored
    try:
        restarted = second.ingest(two.id, ObservationBatch(observations=later))
    finally:
        second.close()
    made = [(d.step, d.new_value) for d in kept.created]
    assert made and made == [(d.step, d.new_value) for d in restarted.created]


def test_a_fit_against_the_declared_direction_falls_back(tmp_path) -> None:
    """The plant answers a higher rate with a higher probe (direct); a controller that declares
    ``reverse`` gets no tuned gains of the other sign (they would push the probe away from its
    setpoint under the declared law's fallback): the fit is refused as ``wrong_direction``, the
    event says why, and the law runs on the fallback gains."""
    url = f"sqlite:///{tmp_path / 'w.db'}"
    from actuator.migrate import upgrade

    upgrade(url)
    store = Store(url)
    try:
        declared = {**AUTO, "name": "auto-reverse", "controllers": [controller(direction="reverse")]}
        policy = store.create_policy(load_policy(declared))
        run, _ = store.create_run(RunCreate(policy=declared["name"], knobs=KNOBS, identification=[WINDOW]), policy)
        store.ingest(run.id, ObservationBatch(observations=plant(range(0, 13))))
        state = store.get_run(run.id).controllers["hold"]["auto"]
        assert state["status"] == "fallback" and state["problem"] == "wrong_direction"
        events = [e for e in store.list_events(run.id) if e.kind.startswith("auto_gains")]
        assert [e.kind for e in events] == ["auto_gains_fallback"]
        assert "against the controller's direction 'reverse'" in events[0].payload["reason"]
        assert events[0].payload["gains"]["direction"] == "reverse"
        # the same plant under a controller declaring its true direction is tuned (the rule is the sign)
        agreeing = store.create_run(RunCreate(policy=AUTO["name"], knobs=KNOBS, identification=[WINDOW]),
                                    store.create_policy(load_policy(AUTO)))[0]
        store.ingest(agreeing.id, ObservationBatch(observations=plant(range(0, 13))))
        assert store.get_run(agreeing.id).controllers["hold"]["auto"]["status"] == "tuned"
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["setpoint", "constraint"])
def test_a_probe_past_its_setpoint_ends_the_test_early(tmp_path, kind: str) -> None:
    """plant() passes 1.2 at step 4 of the 12-step test: the test ends there (5 readings: too few
    to fit, so the fallback gains), the event says so, and the law decides from that observation's
    next one on instead of waiting for step 12. A constraint ends it when its budget binds."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    from actuator.migrate import upgrade

    upgrade(url)
    store = Store(url)
    try:
        extra = {"kind": "constraint", "bound": "upper", "knob": "kl_weight"} if kind == "constraint" else {}
        doc = {**AUTO, "name": f"early-{kind}", "controllers": [controller(setpoint=1.2, **extra)]}
        knobs = KNOBS if kind == "setpoint" else [{"name": "kl_weight", "value": 0.0, "min": 0.0, "max": 2.0}]
        window = {**WINDOW, "knob": "kl_weight", "size": 0.2} if kind == "constraint" else WINDOW
        run, _ = store.create_run(RunCreate(policy=doc["name"], knobs=knobs, identification=[window]),
                                  store.create_policy(load_policy(doc)))
        made = []
        for o in plant(range(0, 13)):
            if kind == "constraint":
                o = o.model_copy(update={"knobs": {"kl_weight": 0.0}})
            made += [(d.step, d.controller) for d in store.ingest(run.id, ObservationBatch(observations=[o])).created]
        (ev,) = [e for e in store.list_events(run.id) if e.kind.startswith("auto_gains")]
        assert ev.kind == "auto_gains_fallback" and ev.step == 4
        assert "the step test ended early at step 4: custom.plant 1.253 passed 1.2" in ev.payload["reason"]
        assert "(steps 0-4)" in ev.payload["reason"]
        assert made and made[0] == (5, "hold")  # on the reading that ended it: decided for step 5
        assert store.get_run(run.id).controllers["hold"]["auto"]["status"] == "fallback"
    finally:
        store.close()
