"""dpo_kl's restoring arms as the service sees them (issue 40): the preset's lr + anchor, the
split-range arm, and the predictive / ramp variants (``--predict``, ``--ramp``) are policies the
real service registers with the arm's knobs, carrying the horizon and ramp on the controllers that
take them (the PID-Lagrangian takes no ramp); the split arm's legs put the learning rate at the
configured rate, never above, and the anchor weight at its ceiling."""

from __future__ import annotations

import httpx
import pytest

from benchmarks.control.dpo_kl import RESTORING, parser, restoring_policy


def args(*argv: str):
    return parser().parse_args(list(argv))


@pytest.mark.parametrize("kind", RESTORING)
@pytest.mark.parametrize("flags", [(), ("--predict", "2"), ("--predict", "2", "--ramp", "8")])
def test_every_restoring_arm_registers_on_the_real_service(kind, flags, sqlite_service) -> None:
    a = args(*flags)
    policy, knobs = restoring_policy(a, kind)
    specs = [{"name": name, "value": a.lr if name == "learning_rate" else 0.0, "scale":
              "log" if name == "learning_rate" else "linear", **bounds} for name, bounds in knobs.items()]
    r = httpx.post(f"{sqlite_service.url}/v1/runs", json={"name": f"{kind}-{len(flags)}", "policy": policy,
                                                            "knobs": specs})
    assert r.status_code == 201, r.text
    stored = r.json()["policy"]["controllers"]
    assert [c["name"] for c in stored] == [c["name"] for c in policy["controllers"]]
    for c in stored:
        assert c.get("horizon", 0) == (2 if "--predict" in flags else 0)
        ramp = 8 if "--ramp" in flags and c.get("kind") != "constraint" else 0
        assert (c.get("setpoint_ramp") or 0) == ramp


def test_the_split_arm_runs_the_learning_rate_up_to_the_configured_rate_and_the_anchor_below_zero() -> None:
    a = args()
    policy, knobs = restoring_policy(a, "split")
    (split,) = policy["controllers"]
    legs = {leg["knob"]: leg for leg in split["legs"]}
    assert split["kind"] == "split_range" and split["setpoint"] == a.target
    assert legs["learning_rate"]["range"] == [0.0, 1.0] and legs["learning_rate"]["values"] == [a.lr * a.lr_floor, a.lr]
    assert legs["kl_weight"]["range"] == [-1.0, 0.0] and legs["kl_weight"]["values"] == [a.w_max, 0.0]
    assert knobs["learning_rate"]["max"] == a.lr and knobs["kl_weight"]["max"] == a.w_max


def test_the_shipped_preset_is_the_arm_picked_on_seed_0_and_judged_on_five_seeds() -> None:
    """preset:dpo-kl is the benchmark's lr + anchor arm with the 8-interval ramp on the learning
    rate (issue 40's pick): same probe, setpoints, relative gains and ramp, controller by controller."""
    from actuator.policy import load_preset

    preset = load_preset("dpo-kl").model_dump(exclude_none=True)
    a = args("--ramp", "8")
    arm, _ = restoring_policy(a, "lr+anchor")
    shipped = {c["name"]: c for c in preset["controllers"]}
    for c in arm["controllers"]:
        mine = shipped[c["name"]]
        assert (mine["probe"], mine["knob"], mine["setpoint"]) == (c["probe"], c["knob"], c["setpoint"])
        assert (mine["kp"], mine["ki"]) == pytest.approx((c["kp"] * c["setpoint"], c["ki"] * c["setpoint"]))
        assert (mine.get("setpoint_ramp") or 0) == (c.get("setpoint_ramp") or 0)
    assert shipped["kl-lr"]["setpoint_ramp"] == 8
