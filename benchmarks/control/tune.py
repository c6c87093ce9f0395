"""Gains without a sweep, on the simulated plants: identify from a short step test, tune, compare.

For each plant and seed: an identification pre-run of ``IDENT_STEPS`` intervals (20% of the
300-interval run) applies a :class:`StepTest` to the knob, its observations go through
:func:`actuator.tune.tune_controller` (the path of ``actuator policy tune`` and
``POST /v1/policies/tune``), and the proposed gains then run the real 300-interval loop on the
plant, scored beside the best hand-tuned gains:

* ``first_order_lag`` (gain 2, tau 8, two intervals of dead time, noise sd 0.05, setpoint 1):
  the hand-tuned gains are the best of a grid (fastest mean settling with overshoot <= 15% on
  every seed) picked on seeds 100..104;
* ``kl_beta``, ``lr_drift``: the PID arms of ``plants.py``, themselves grid-searched.

Targets (issue 16): settling within 1.5x the hand-tuned settling, overshoot <= 15%, on every
seed 0..4 (``met`` per seed). The pre-run uses seeds 1000+s, so identification never sees the
evaluation's noise. On ``lr_drift`` no arm settles (late in the run drift at the ceiling learning
rate falls below the band: the setpoint leaves reach), so each seed also reports the first interval
inside the band, the intervals inside it, and ``budget_met``: overshoot <= 15% and no more steps over the budget than the
hand-tuned arm.

    python -m benchmarks.control.tune [--aggressiveness 1.0]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from actuator.controllers import PIDConfig
from actuator.controllers.identify import StepTest
from actuator.policy import load_policy
from actuator.tune import tune_controller

from .plants import (
    FirstOrderLagPlant,
    KLBetaPlant,
    LRDriftPlant,
    PIDArm,
    Plant,
    Trace,
    kl_scenario,
    lr_scenario,
    run_arm,
    summarize,
)

STEPS = 300
IDENT_STEPS = 60  # 20% of the run
SEEDS = range(5)
HAND_GRID_SEEDS = range(100, 105)


@dataclass
class Case:
    name: str
    plant: Any  # a factory
    probe: str
    knob: dict[str, Any]
    hand: PIDArm
    test: StepTest


def _fol_plant() -> Plant:
    return FirstOrderLagPlant(gain=2.0, tau=8.0, delay=2, noise_sd=0.05, setpoint=1.0, initial_knob=0.0)


def _fol_hand() -> PIDArm:
    """Best of a grid on seeds 100..104: fastest mean settling with overshoot <= 15% on each."""
    best: tuple[float, PIDArm] | None = None
    for kp in (0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2.0):
        for ki in (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5):
            arm = PIDArm("hand", PIDConfig(setpoint=1.0, kp=kp, ki=ki, out_min=-2.0, out_max=2.0))
            rows = [summarize(run_arm(_fol_plant(), arm, STEPS, s)) for s in HAND_GRID_SEEDS]
            if any(r["settling"] is None or r["overshoot_pct"] > 15.0 for r in rows):
                continue
            mean = sum(r["settling"] for r in rows) / len(rows)
            if best is None or mean < best[0]:
                best = (mean, arm)
    assert best is not None
    return best[1]


def cases() -> list[Case]:
    kl_hand, lr_hand = kl_scenario().arms[0], lr_scenario().arms[0]
    assert isinstance(kl_hand, PIDArm) and isinstance(lr_hand, PIDArm)
    return [
        Case("first_order_lag", _fol_plant, "custom.y",
             {"name": "custom.u", "value": 0.0, "min": -2.0, "max": 2.0, "scale": "linear"}, _fol_hand(),
             StepTest(size=0.5, length=IDENT_STEPS - 20, hold=20)),
        Case("kl_beta", KLBetaPlant, "kl_drift",
             {"name": "kl_beta", "value": 0.1, "min": 0.01, "max": 2.0, "scale": "log", "max_step": 0.25}, kl_hand,
             StepTest(size=0.3, length=IDENT_STEPS - 20, hold=20)),
        Case("lr_drift", LRDriftPlant, "kl_drift",
             {"name": "learning_rate", "value": 2e-4, "min": 1e-6, "max": 2e-4, "scale": "log", "max_step": 0.3},
             lr_hand, StepTest(size=-0.4, length=IDENT_STEPS - 20, hold=20)),
    ]


def _policy(case: Case) -> Any:
    cfg = case.hand.config
    ctrl: dict[str, Any] = {"name": "c", "probe": case.probe, "knob": case.knob["name"], "setpoint": cfg.setpoint,
                            "kp": cfg.kp, "ki": cfg.ki, "kd": cfg.kd, "direction": cfg.direction}
    if case.hand.filter_kind == "ema":
        ctrl["filter"] = {"kind": "ema", "alpha": case.hand.filter_params["alpha"]}
    return load_policy({"name": f"tune-{case.name}".replace("_", "-"), "controllers": [ctrl]})


def identification_run(case: Case, seed: int) -> list[SimpleNamespace]:
    """The pre-run: the step test on the knob, one observation per interval, as an agent records
    them: each reports the knob value in effect from then on (the next interval's)."""
    plant = case.plant()
    plant.reset(random.Random(seed))
    nominal, scale = case.knob["value"], case.knob["scale"]
    out = []
    for k in range(IDENT_STEPS):
        u = case.test.value(k, nominal, scale, case.knob["min"], case.knob["max"])
        obs = plant.step(u)
        values = {case.probe: obs.measurement}
        after = case.test.value(k + 1, nominal, scale, case.knob["min"], case.knob["max"])
        out.append(SimpleNamespace(seq=k, step=k + 1, probes=values, metrics={}, knobs={case.knob["name"]: after}))
    return out


def tuned_arm(case: Case, result: dict[str, Any]) -> PIDArm:
    g = result["gains"]
    return PIDArm("tuned", replace(case.hand.config, kp=g["kp"], ki=g["ki"], kd=g["kd"], direction=g["direction"],
                                       setpoint_weight=g["setpoint_weight"]),
                  filter_kind=case.hand.filter_kind, filter_params=case.hand.filter_params)


def _inside(trace: Trace, band: float = 0.10) -> list[bool]:
    return [abs(y - sp) <= band * abs(sp) for y, sp in zip(trace.true, trace.setpoint)]


def first_in_band(trace: Trace) -> int | None:
    """The first interval whose true output is within +-10% of the setpoint (``None``: never)."""
    return next((k for k, inside in enumerate(_inside(trace)) if inside), None)


def _met(tuned: dict[str, Any], hand: dict[str, Any]) -> bool:
    return (tuned["settling"] is not None and hand["settling"] is not None
            and tuned["settling"] <= 1.5 * hand["settling"] and tuned["overshoot_pct"] <= 15.0)


def run(aggressiveness: float = 1.0, only: set[str] | None = None) -> dict[str, Any]:
    """Per plant (``only``: these), per seed: identify, tune, run both arms, score."""
    out: dict[str, Any] = {}
    for case in cases():
        if only is not None and case.name not in only:
            continue
        policy = _policy(case)
        rows = []
        for seed in SEEDS:
            result = tune_controller(policy, {case.knob["name"]: case.knob}, "c",
                                     identification_run(case, 1000 + seed), aggressiveness=aggressiveness).to_dict()
            budget = getattr(case.plant(), "budget", None)
            tuned_trace = run_arm(case.plant(), tuned_arm(case, result), STEPS, seed)
            hand_trace = run_arm(case.plant(), case.hand, STEPS, seed)
            tuned, hand = summarize(tuned_trace, budget), summarize(hand_trace, budget)
            m, g, p = result["model"], result["gains"], result["predicted"]["proposed"]
            rows.append({"seed": seed, "model": m["kind"], "gain": m["gain"], "tau": m["tau"], "theta": m["theta"],
                         "theta_hi": m["theta_hi"], "drift": m["drift"],
                         "r2": m["r2"], "kp": g["kp"], "ki": g["ki"], "kd": g["kd"], "b": g["setpoint_weight"],
                         "tau_c": g["tau_c"], "noise_slowed": result["noise_floor"] is not None,
                         "predicted_settling": p["settling_steps"],
                         "predicted_overshoot": p["overshoot_pct"], "tuned_settling": tuned["settling"],
                         "tuned_overshoot": tuned["overshoot_pct"], "hand_settling": hand["settling"],
                         "hand_overshoot": hand["overshoot_pct"], "met": _met(tuned, hand),
                         **({"tuned_over_budget": tuned["over_budget"], "hand_over_budget": hand["over_budget"],
                             "tuned_in_band": first_in_band(tuned_trace), "hand_in_band": first_in_band(hand_trace),
                             "tuned_band_intervals": sum(_inside(tuned_trace)),
                             "hand_band_intervals": sum(_inside(hand_trace)),
                             "budget_met": tuned["overshoot_pct"] <= 15.0
                             and tuned["over_budget"] <= hand["over_budget"]}
                            if budget is not None else {})})
        out[case.name] = {"hand_gains": {"kp": case.hand.config.kp, "ki": case.hand.config.ki,
                                         "kd": case.hand.config.kd}, "rows": rows,
                          "seeds_met": sum(r["met"] for r in rows), "target_met": all(r["met"] for r in rows),
                          **({"seeds_budget_met": sum(r["budget_met"] for r in rows)} if "budget_met" in rows[0]
                             else {})}
    return out


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aggressiveness", type=float, default=1.0)
    args = parser.parse_args()
    results = run(args.aggressiveness)
    for name, r in results.items():
        hg = r["hand_gains"]
        budget = f", overshoot and budget met on {r['seeds_budget_met']}/5" if "seeds_budget_met" in r else ""
        print(f"== {name}: hand-tuned kp={hg['kp']:.3g} ki={hg['ki']:.3g} kd={hg['kd']:.3g}; "
              f"identification {IDENT_STEPS}/{STEPS} steps; target {'met' if r['target_met'] else 'MISSED'} "
              f"({r['seeds_met']}/5 seeds{budget})")
        keys = list(r["rows"][0])
        print("  " + " ".join(f"{k:>10.10s}" for k in keys))
        for row in r["rows"]:
            print("  " + " ".join(f"{_fmt(row[k]):>10s}" for k in keys))
    path = Path(__file__).resolve().parents[1] / "results" / "tune.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"command": "python -m benchmarks.control.tune", "aggressiveness": args.aggressiveness,
                                "machine": platform.platform(), "identification_steps": IDENT_STEPS, "steps": STEPS,
                                "results": results}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
