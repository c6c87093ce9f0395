"""actuator/tune.py without the service: the replay goes through the engine and keeps the knob's
bounds and rate limit, an unreachable setpoint is flagged, and what cannot be tuned is refused."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from actuator.controllers.identify import KnobDidNotMove, identify
from actuator.policy import load_policy
from actuator.simulate import simulate_model
from actuator.tune import UnknownController, WrongDirection, series, tune_controller

KNOB = {"name": "learning_rate", "value": 1e-3, "min": 1e-4, "max": 4e-3, "scale": "log", "max_step": 0.2}


def observations(factor: float = 2.0, seed: int = 0) -> list[SimpleNamespace]:
    """kl_drift = 0.3 + 0.1 * ln(lr / 1e-3) through a 10-step lag, a probe every 2 steps."""
    rng = random.Random(seed)
    y, out = 0.3, []
    for step in range(121):
        lr = 1e-3 * (factor if step > 20 else 1.0)
        if step:
            y += (0.3 + 0.1 * math.log(lr / 1e-3) - y) * (1 - math.exp(-1 / 10))
        if step % 2 == 0:
            out.append(SimpleNamespace(seq=step // 2, step=step, probes={"kl_drift": y + rng.gauss(0, 0.002)},
                                       metrics={}, knobs={"learning_rate": lr}))
    return out


def policy(setpoint: float, kind: str = "setpoint") -> object:
    return load_policy({"name": "p", "controllers": [{"name": "c", "kind": kind, "probe": "kl_drift",
                                                      "knob": "learning_rate", "setpoint": setpoint, "kp": 1.0,
                                                      "ki": 0.1}]})


def test_replay_on_the_model_keeps_bounds_and_rate_limit():
    obs = observations()
    steps, us, ys = series(obs, "kl_drift", "learning_rate", 1e-3, "log")
    model = identify(steps, us, ys)
    result = tune_controller(policy(0.35), {"learning_rate": KNOB}, "c", obs).to_dict()
    assert result["predicted"]["proposed"]["settling_steps"] is not None and not result["warnings"]
    doc = load_policy(result["policy"])
    sim = simulate_model(doc, {"learning_rate": KNOB}, model, probe="kl_drift", knob="learning_rate", steps=200,
                         every=2)
    knobs = [t["knob"] for t in sim["trace"]]
    assert all(KNOB["min"] <= k <= KNOB["max"] for k in knobs)
    assert all(abs(math.log(b / a)) <= KNOB["max_step"] + 1e-12 for a, b in zip(knobs, knobs[1:]))
    assert sim["decisions"] and all(d.step % 2 == 1 for d in sim["decisions"])  # from the step after a probe
    assert abs(sim["trace"][-1]["probe"] - 0.35) < 0.01


def test_an_unreachable_setpoint_is_flagged():
    # 0.3 + 0.1 * ln(4) = 0.44 at the upper bound: 0.6 is out of reach
    result = tune_controller(policy(0.6), {"learning_rate": KNOB}, "c", observations()).to_dict()
    assert any("out of reach" in w for w in result["warnings"]), result["warnings"]
    assert any("does not settle" in w for w in result["warnings"])
    assert result["predicted"]["proposed"]["final_knob"] == pytest.approx(KNOB["max"])


def test_refusals():
    with pytest.raises(UnknownController, match="no controller 'x'"):
        tune_controller(policy(0.35), {"learning_rate": KNOB}, "x", observations())
    maximize = load_policy({"name": "p", "controllers": [{"name": "c", "kind": "maximize", "probe": "kl_drift",
                                                          "knob": "learning_rate", "dither": 0.1, "gain": 0.1}]})
    with pytest.raises(UnknownController, match="maximize controller"):
        tune_controller(maximize, {"learning_rate": KNOB}, "c", observations())
    with pytest.raises(UnknownController, match="does not declare"):
        tune_controller(policy(0.35), {"kl_beta": {**KNOB, "name": "kl_beta"}}, "c", observations())
    # a 3% move on a log knob is below the 5% it takes
    with pytest.raises(KnobDidNotMove, match="larger than 0.05"):
        tune_controller(policy(0.35), {"learning_rate": KNOB}, "c", observations(factor=1.03))


def fopdt_observations(*, start: float, u0: float = 0.0, seed: int = 0, noise: float = 0.01) -> list[SimpleNamespace]:
    """y -> 2 * u through a lag of 8 steps and 2 steps of dead time, from y = ``start`` (at rest
    when start = 2 * u0), a step of +0.5 on a linear knob at step 20, a probe every step."""
    rng = random.Random(seed)
    y, pipe, out = start, [u0, u0], []
    for step in range(61):
        u = u0 + (0.5 if step > 20 else 0.0)
        if step:
            pipe.append(u)
            y += (2.0 * pipe.pop(0) - y) * (1 - math.exp(-1 / 8))
        out.append(SimpleNamespace(seq=step, step=step, probes={"y": y + rng.gauss(0, noise)}, metrics={},
                                   knobs={"custom.u": u}))
    return out


LINEAR = {"name": "custom.u", "value": 0.0, "min": -2.0, "max": 2.0, "scale": "linear"}


def linear_policy(setpoint: float) -> object:
    return load_policy({"name": "p", "controllers": [{"name": "c", "probe": "custom.y", "knob": "custom.u",
                                                      "setpoint": setpoint, "kp": 0.5, "ki": 0.1}]})


def test_the_replay_picks_p_on_the_error_for_a_plant_at_rest_and_it_settles_faster():
    obs = [SimpleNamespace(**{**vars(o), "probes": {"custom.y": o.probes["y"]}}) for o in fopdt_observations(start=0.0)]
    result = tune_controller(linear_policy(1.5), {"custom.u": LINEAR}, "c", obs).to_dict()
    g, pred = result["gains"], result["predicted"]["proposed"]
    assert g["setpoint_weight"] == 1.0 and result["policy"]["controllers"][0]["setpoint_weight"] == 1.0
    # SIMC's target: about tau_c + theta to reach the band, where I-P (b = 0) keeps the plant's tau
    doc = load_policy(result["policy"])
    slow = load_policy({**result["policy"], "controllers": [{**result["policy"]["controllers"][0],
                                                             "setpoint_weight": 0.0}]})
    model = identify(*series(obs, "custom.y", "custom.u", 0.0, "linear")[:3])

    def settle(d: object) -> int:
        sim = simulate_model(d, {"custom.u": LINEAR}, model, probe="custom.y", knob="custom.u", steps=120, every=1)
        ys = [t["probe"] for t in sim["trace"]]
        last_out = max(i for i, y in enumerate(ys) if abs(y - 1.5) > 0.15)
        return last_out + 1

    assert settle(doc) < 0.7 * settle(slow)
    assert pred["settling_steps"] is not None and pred["overshoot_pct"] <= 15.0


def test_the_replay_weighs_p_on_the_initial_error_down_for_a_probe_that_starts_moving_on_its_own():
    # y starts at 0 and rises towards 2 * u0 = 2 by itself (KL starts at 0 whatever beta is), past
    # the setpoint 1.5: P on all of the initial error (+1.5) raises the knob the plant needs lowered
    # and overshoots; none of it (I-P) leaves P braking the rise, and the approach is slow
    obs = [SimpleNamespace(**{**vars(o), "probes": {"custom.y": o.probes["y"]}})
           for o in fopdt_observations(start=0.0, u0=1.0)]
    knobs = {"custom.u": {**LINEAR, "value": 1.0}}
    result = tune_controller(linear_policy(1.5), knobs, "c", obs).to_dict()
    assert result["model"]["transient"] < 0
    b, pred = result["gains"]["setpoint_weight"], result["predicted"]["proposed"]
    assert 0.0 < b < 1.0 and pred["overshoot_pct"] <= 15.0
    model = identify(*series(obs, "custom.y", "custom.u", 1.0, "linear")[:3])

    def replay(weight: float) -> tuple[int, float]:
        c = {**result["policy"]["controllers"][0], "setpoint_weight": weight}
        sim = simulate_model(load_policy({**result["policy"], "controllers": [c]}), knobs, model, probe="custom.y",
                             knob="custom.u", steps=120, every=1)
        ys = [t["probe"] for t in sim["trace"]]
        return max(i for i, y in enumerate(ys) if abs(y - 1.5) > 0.15) + 1, (max(ys) - 1.5) / 1.5 * 100

    assert replay(1.0)[1] > 15.0  # P on the whole error
    assert replay(b)[0] <= 0.5 * replay(0.0)[0]  # and faster than I-P


def test_a_drifting_probe_is_fitted_with_its_drift_and_a_setpoint_it_drifts_out_of_reach_is_flagged():
    # the probe falls 0.04 per step on its own: 1.5 needs u = 0.75 at the start, past the bound 2
    # after ~60 steps
    obs = [SimpleNamespace(**{**vars(o), "probes": {"custom.y": o.probes["y"] - 0.04 * o.step}})
           for o in fopdt_observations(start=0.0)]
    result = tune_controller(linear_policy(1.5), {"custom.u": LINEAR}, "c", obs).to_dict()
    m = result["model"]
    assert m["kind"] == "fopdt" and m["drift"] == pytest.approx(-0.04, rel=0.1)
    assert m["gain"] == pytest.approx(2.0, rel=0.2)
    reach = [w for w in result["warnings"] if "out of reach" in w]
    assert reach and "after" in reach[0] and "per step on its own" in reach[0], result["warnings"]
    # without the drift: reachable, no warning
    flat = tune_controller(linear_policy(1.5), {"custom.u": LINEAR}, "c",
                           [SimpleNamespace(**{**vars(o), "probes": {"custom.y": o.probes["y"]}})
                            for o in fopdt_observations(start=0.0)]).to_dict()
    assert flat["model"]["drift"] == 0.0 and not any("out of reach" in w for w in flat["warnings"])


def test_a_noisy_probe_slows_tau_c_until_the_loops_own_jitter_fits_in_the_band():
    from actuator.controllers.tuning import noise_jitter

    quiet = [SimpleNamespace(**{**vars(o), "probes": {"custom.y": o.probes["y"]}})
             for o in fopdt_observations(start=0.0, noise=0.01)]
    noisy = [SimpleNamespace(**{**vars(o), "probes": {"custom.y": o.probes["y"]}})
             for o in fopdt_observations(start=0.0, noise=0.3)]
    q = tune_controller(linear_policy(1.0), {"custom.u": LINEAR}, "c", quiet).to_dict()
    n = tune_controller(linear_policy(1.0), {"custom.u": LINEAR}, "c", noisy).to_dict()
    assert q["noise_floor"] is None
    assert n["noise_floor"] is not None and n["gains"]["tau_c"] > 1.5 * q["gains"]["tau_c"]
    model = identify(*series(noisy, "custom.y", "custom.u", 0.0, "linear")[:3])
    from actuator.controllers.tuning import Tuning
    jitter = noise_jitter(model, Tuning(**n["gains"]), interval=n["interval"])
    assert jitter is not None and 2 * jitter <= 0.1 * 1.0


def test_series_pairs_each_probe_with_the_knob_the_steps_before_it_ran_at():
    # the agent reports the knob after the boundary's moves: a step test applied at step 2 shows
    # in the observation of step 2, but steps 1-2 ran at the old value
    obs = [SimpleNamespace(seq=i, step=i, probes={"kl_drift": 0.1 * i}, metrics={},
                           knobs={"learning_rate": 1e-3 if i < 2 else 2e-3}) for i in range(5)]
    obs.insert(3, SimpleNamespace(seq=2.5, step=2, probes={}, metrics={}, knobs={}))  # no probe: skipped
    steps, us, ys = series(obs, "kl_drift", "learning_rate", 1e-3, "log")
    assert steps == [0, 1, 2, 3, 4] and ys == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])
    assert us == pytest.approx([math.log(1e-3)] * 3 + [math.log(2e-3)] * 2)


WEIGHT = {"name": "kl_weight", "value": 0.0, "min": 0.0, "max": 2.0, "scale": "linear", "max_step": 0.25}


def weight_observations(gain: float) -> list[SimpleNamespace]:
    """perplexity = 50 + gain * w through a lag of 4 steps; w steps 0 -> 1 at step 3."""
    y, out = 50.0, []
    for step in range(31):
        w = 1.0 if step > 3 else 0.0
        if step:
            y += (50.0 + gain * w - y) * (1 - math.exp(-1 / 4))
        # the agent reports the value in effect from the next step on (see series)
        out.append(SimpleNamespace(seq=step, step=step, probes={"perplexity": y}, metrics={},
                                   knobs={"kl_weight": 1.0 if step >= 3 else 0.0}))
    return out


def budget_policy() -> object:
    return load_policy({"name": "p", "controllers": [{"name": "budget", "kind": "constraint", "probe": "perplexity",
                                                      "knob": "kl_weight", "setpoint": 48.0, "kp": 0.1, "ki": 0.01}]})


def test_a_constraint_controller_gets_simc_gains_and_keeps_its_bound():
    result = tune_controller(budget_policy(), {"kl_weight": WEIGHT}, "budget", weight_observations(-4.0)).to_dict()
    assert result["model"]["gain"] == pytest.approx(-4.0, rel=0.2)
    assert result["model"]["tau"] == pytest.approx(4.0, rel=0.2)
    c = result["policy"]["controllers"][0]
    assert c["kind"] == "constraint" and c["bound"] == "upper" and c["setpoint_weight"] == 0.0
    assert c["kp"] == pytest.approx(result["gains"]["kp"]) and c["kp"] > 0 and c["ki"] > 0
    assert load_policy(result["policy"]).controllers[0].kp == c["kp"]


def test_tuning_a_controller_with_relative_gains_proposes_absolute_gains_the_engine_uses_once():
    # The fitted gains are per probe unit; kept under `gains: relative` the engine would divide them
    # by the budget again (48x too weak here).
    relative = load_policy({"name": "p", "controllers": [{
        "name": "budget", "kind": "constraint", "probe": "perplexity", "knob": "kl_weight", "setpoint": 48.0,
        "gains": "relative", "kp": 4.8, "ki": 0.48}]})
    result = tune_controller(relative, {"kl_weight": WEIGHT}, "budget", weight_observations(-4.0)).to_dict()
    assert result["current_gains"]["gains"] == "relative"
    c = load_policy(result["policy"]).controllers[0]
    assert c.gains == "absolute" and c.kp == pytest.approx(result["gains"]["kp"])
    assert c.error_span(48.0, None) == 1.0
    absolute = tune_controller(budget_policy(), {"kl_weight": WEIGHT}, "budget", weight_observations(-4.0)).to_dict()
    assert result["predicted"]["proposed"] == absolute["predicted"]["proposed"]


def test_a_constraint_knob_that_moved_the_probe_the_wrong_way_is_refused():
    # raising the anchor weight raised the perplexity: an upper bound cannot be held with that
    with pytest.raises(WrongDirection, match="raised perplexity.*upper-bound constraint needs a knob that lowers"):
        tune_controller(budget_policy(), {"kl_weight": WEIGHT}, "budget", weight_observations(+4.0))
