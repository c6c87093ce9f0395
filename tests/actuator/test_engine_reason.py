"""The decision reason says what really moved the knob, in a line an operator can check."""

from __future__ import annotations

import math
import re

from actuator.engine import Engine, RunContext
from actuator.policy import PolicyDocument
from actuator.schemas import ObservationCreate

POLICY = {
    "name": "reason",
    "controllers": [{"name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 1.0,
                     "kp": 1.0, "ki": 0.1, "direction": "direct"}],
}


def _run(drifts: list[float]) -> list:
    engine = Engine(PolicyDocument.model_validate(POLICY))
    ctx = RunContext.from_json({"learning_rate": {"value": 3e-5, "min": 3e-7, "max": 3e-5, "scale": "log",
                                                  "max_step": 1.0}})
    decisions = []
    for k, drift in enumerate(drifts):
        obs = ObservationCreate(seq=k, step=2 * k, probes={"kl_drift": drift},
                                knobs={"learning_rate": ctx.knobs["learning_rate"].value})
        decisions.extend(engine.observe(ctx, obs).decisions)
    return decisions


def test_a_cut_below_setpoint_names_the_rising_trend_and_the_terms_that_moved() -> None:
    # drift rising towards the setpoint: the velocity-form P brakes before it is reached
    decisions = _run([0.0, 0.5, 0.8])
    assert decisions, "a rising drift must brake the learning rate"
    first = decisions[0]
    assert first.new_value < first.old_value
    assert "kl_drift 0.5 below setpoint 1 and rising" in first.reason
    terms = dict(re.findall(r"Δ([PID]) ([+-][0-9.e+-]+)", first.reason))
    # P moved by kp * change of error = -0.5, I by ki * error * dt = +0.1 * 0.5 * 2 = +0.1
    assert float(terms["P"]) == -0.5 and math.isclose(float(terms["I"]), 0.1)
    assert math.isclose(math.log(first.new_value / first.old_value), -0.4, abs_tol=1e-9)


def test_a_cut_above_setpoint_reads_above() -> None:
    decisions = _run([0.0, 1.5, 2.0])
    assert all(" above setpoint 1" in d.reason and d.new_value < d.old_value for d in decisions)
    assert "and rising" in decisions[-1].reason


CONSTRAINT = {
    "name": "constraint",
    "controllers": [
        {"name": "drift-budget", "kind": "constraint", "probe": "kl_drift", "knob": "kl_weight", "setpoint": 1.0,
         "kp": 2.0, "ki": 1.0, "priority": 10},
        {"name": "ppl-lr", "probe": "perplexity", "knob": "learning_rate", "setpoint": 20.0, "kp": 0.1, "ki": 0.05},
    ],
}


def test_a_constraint_raises_its_multiplier_only_while_violated_and_says_which_is_active() -> None:
    engine = Engine(PolicyDocument.model_validate(CONSTRAINT))
    ctx = RunContext.from_json({"kl_weight": {"value": 0.0, "min": 0.0, "max": 10.0, "scale": "linear", "max_step": 5.0},
                                "learning_rate": {"value": 1e-4, "min": 1e-6, "max": 1e-4, "scale": "log",
                                                  "max_step": 1.0}})
    weights, reasons = [], []
    for k, drift in enumerate([0.2, 0.6, 0.9, 1.4, 1.2, 0.7, 0.4]):
        obs = ObservationCreate(seq=k, step=k + 1, probes={"kl_drift": drift, "perplexity": 21.0},
                                knobs={n: v.value for n, v in ctx.knobs.items()})
        for d in engine.observe(ctx, obs).decisions:
            if d.knob == "kl_weight":
                reasons.append(d.reason)
        weights.append(ctx.knobs["kl_weight"].value)
    # slack while drift rises to the budget: no weight at all
    assert weights[:3] == [0.0, 0.0, 0.0]
    # violated at 1.4: P = 2 * 0.4, I = 1 * 0.4
    assert math.isclose(weights[3], 1.2)
    assert reasons[0].startswith("constraint drift-budget active: kl_drift 1.4 > budget 1 and rising: "
                                 "kl_weight 0 -> 1.2")
    # back inside the budget: released to 0, and the reason says so
    assert weights[-1] == 0.0
    assert "slack, releasing" in reasons[-1]
    # the lr controller (another probe, lower priority) still acts on the same run
    assert ctx.knobs["learning_rate"].value < 1e-4


def test_a_ramped_controller_names_the_setpoint_in_force_and_its_place_on_the_ramp(sqlite_service) -> None:
    """preset:dpo-kl through the real service: the learning-rate controller cuts the rate while
    the KL is below the final setpoint 0.1, because it acts on a setpoint ramp. Its reason, its
    inputs, the controller's state and `actuator decisions --explain` name the setpoint in force
    (0.1·k/8 at the ramp's k-th interval from a first reading of 0) beside the final one."""
    import httpx
    from typer.testing import CliRunner

    from actuator.cli import app
    from actuator.policy import load_preset

    url = sqlite_service.url
    knobs = [{"name": "learning_rate", "value": 5e-5, "min": 5e-7, "max": 5e-5, "scale": "log", "max_step": 1.0},
             {"name": "kl_weight", "value": 0.0, "min": 0.0, "max": 2.0, "scale": "linear", "max_step": 0.25}]
    run = httpx.post(f"{url}/v1/runs", json={"policy": load_preset("dpo-kl").model_dump(mode="json"),
                                              "knobs": knobs}).json()
    auth = {"Authorization": f"Bearer {run['token']}"}
    for k, kl in enumerate([0.0, 0.0194, 0.035, 0.05]):
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json={"observations": [
            {"seq": k, "step": k, "probes": {"kl_drift": kl}}]})
        assert r.status_code == 200, r.text
    decisions = httpx.get(f"{url}/v1/runs/{run['id']}/decisions").json()["items"]
    cuts = [d for d in decisions if d["knob"] == "learning_rate"]
    assert len(cuts) == 3 and all(d["new_value"] < d["old_value"] for d in cuts)
    for k, d in enumerate(cuts, start=1):
        in_force = d["inputs"]["setpoint_in_force"]
        assert math.isclose(in_force, 0.1 * k / 8) and d["inputs"]["setpoint"] == 0.1
        assert "below setpoint 0.1 and rising" in d["reason"]
        assert (f"the law acted on {d['inputs']['filtered']:.4g} against ramped setpoint {in_force:.4g} "
                f"(ramp {k} of 8 probe intervals toward 0.1), above it") in d["reason"]
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()
    assert math.isclose(state["controllers"]["kl-lr"]["components"]["setpoint_in_force"], 0.1 * 3 / 8)
    out = CliRunner().invoke(app, ["decisions", run["id"], "--url", url, "--explain"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert f"setpoint in force (ramp) {0.1 * 3 / 8:.6g}" in out.output
