"""``kind: split_range`` (issue 40) through the real service (uvicorn, SQLite): on a synthetic KL
trajectory the anchor weight moves while KL is high and the learning rate (never above its
configured peak) while it is low, each stored decision's reason naming the knob that acted; legs
that cannot act as their ranges say, or name a knob the run lacks, are refused with 422 naming the
field and nothing stored; the setpoint action works as for a setpoint controller."""

from __future__ import annotations

import httpx

PEAK = 5e-5
KNOBS = [{"name": "learning_rate", "value": PEAK, "min": 1e-7, "max": 1e-3, "scale": "log", "max_step": None},
         {"name": "kl_weight", "value": 0.0, "min": 0.0, "max": 5.0, "scale": "linear", "max_step": None}]
LEGS = [{"knob": "learning_rate", "range": [0, 1], "values": [1e-6, PEAK], "acts": "direct"},
        {"knob": "kl_weight", "range": [-1, 0], "values": [2.0, 0.0], "acts": "reverse"}]
CONTROLLER = {"name": "kl", "kind": "split_range", "probe": "kl_drift", "setpoint": 0.1, "gains": "relative",
              "kp": 0.5, "ki": 0.3, "legs": LEGS}
KL = [0.02, 0.04, 0.08, 0.12, 0.16, 0.18, 0.17, 0.14, 0.11, 0.09, 0.06, 0.05, 0.05, 0.06]


def register(url: str, name: str, controller: dict = CONTROLLER, knobs: list = KNOBS) -> httpx.Response:
    return httpx.post(f"{url}/v1/runs", json={"policy": {"name": name, "controllers": [controller]}, "knobs": knobs})


def test_the_anchor_acts_when_kl_is_high_and_the_learning_rate_when_it_is_low(module_service) -> None:
    url = module_service.url
    r = register(url, "kl-split")
    assert r.status_code == 201, r.text
    run = r.json()
    auth = {"Authorization": f"Bearer {run['token']}"}
    values = {k["name"]: k["value"] for k in KNOBS}
    seen: dict[int, dict] = {}
    for k, y in enumerate(KL):
        answer = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json={"observations": [
            {"seq": k, "step": 10 * (k + 1), "probes": {"kl_drift": y}, "knobs": dict(values)}]})
        assert answer.status_code == 200, answer.text
        for d in sorted(answer.json()["decisions"], key=lambda d: d["number"]):
            if d["number"] not in seen:
                seen[d["number"]] = {**d, "kl": y}
                values[d["knob"]] = d["new_value"]
    stored = httpx.get(f"{url}/v1/runs/{run['id']}/decisions", params={"limit": 100}).json()["items"]
    assert sorted(d["number"] for d in stored) == sorted(seen)
    assert all(d["controller"] == "kl" for d in stored)
    for d in stored:
        assert d["reason"].startswith("split_range kl: kl_drift"), d["reason"]
        moved = "raised" if d["new_value"] > d["old_value"] else "lowered"
        assert f"{d['knob']} {moved}" in d["reason"], d["reason"]
    decided = list(seen.values())
    raised_anchor = [d for d in decided if d["knob"] == "kl_weight" and d["new_value"] > d["old_value"]]
    raised_lr = [d for d in decided if d["knob"] == "learning_rate" and d["new_value"] > d["old_value"]]
    assert raised_anchor and all(d["kl"] > 0.1 for d in raised_anchor), decided
    assert raised_lr and all(d["kl"] < 0.1 for d in raised_lr), decided
    assert all(d["new_value"] <= PEAK * (1 + 1e-12) for d in decided if d["knob"] == "learning_rate")
    assert all("to lower kl_drift" in d["reason"] for d in raised_anchor)
    assert all("to raise kl_drift" in d["reason"] for d in raised_lr)
    # the law's output u is stored in the controller's state and with each decision
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()["controllers"]["kl"]
    assert state["pid"]["last_output"] is not None and -1 <= state["components"]["u"] <= 1
    # the setpoint action works as for a setpoint controller
    r = httpx.put(f"{url}/v1/runs/{run['id']}/controllers/kl/setpoint", json={"setpoint": 0.08})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json={"observations": [
        {"seq": len(KL), "step": 10 * (len(KL) + 1), "probes": {"kl_drift": 0.09}, "knobs": dict(values)}]})
    assert httpx.get(f"{url}/v1/runs/{run['id']}").json()["controllers"]["kl"]["setpoint"] == 0.08


def test_bad_legs_are_refused_naming_the_field_and_nothing_is_stored(module_service) -> None:
    url = module_service.url
    before = len(httpx.get(f"{url}/v1/runs").json())
    wrong_way = {**LEGS[1], "values": [0.0, 2.0]}
    for controller, knobs, loc in (
        ({**CONTROLLER, "legs": [LEGS[0], wrong_way]}, KNOBS, "controllers.0.legs.1"),
        ({**CONTROLLER, "legs": [LEGS[0], {**LEGS[1], "range": [-1, 0.5]}]}, KNOBS, "controllers.0.legs"),
        ({**CONTROLLER, "legs": [LEGS[0], {**LEGS[1], "range": [-2, 0]}]}, KNOBS, "controllers.0.legs.1.range"),
        (CONTROLLER, KNOBS[:1], "controllers.0.legs.1.knob"),  # the run has no kl_weight
        ({**CONTROLLER, "legs": [LEGS[0], {**LEGS[1], "values": [9.0, 0.0]}]}, KNOBS,
         "controllers.0.legs.1.values"),  # outside the run's bounds [0, 5]
    ):
        r = register(url, "kl-split-bad", controller, knobs)
        assert r.status_code == 422, r.text
        assert any(e["loc"].endswith(loc) for e in r.json()["detail"]["errors"]), r.text
    assert len(httpx.get(f"{url}/v1/runs").json()) == before
    assert httpx.get(f"{url}/v1/policies/kl-split-bad").status_code == 404
