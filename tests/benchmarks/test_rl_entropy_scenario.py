"""The rl-entropy scenario on the contract (issue 55), and rl-kl's free-signal arm: the figures
computed from a logged-entropy trace, the arms' trainer settings (TRL's own adaptive law with its
1.16 fields), the preset the Actuator arms run (as the real service stores it), and the aggregate
through the validation split judging the preset against TRL's law."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from benchmarks.control import rl_entropy
from benchmarks.control.contract import ArmResult, validate, write_seed
from benchmarks.control.rl_entropy import FIXED, OPEN, PRESET, SPEC, TRL, control_figures, preset_policy, trainer_config
from benchmarks.control.rl_kl import FREE, free_policy
from benchmarks.control.rl_kl import parser as rl_kl_parser
from benchmarks.control.validate import spec

TARGET = 1.0


def trace(values: list[float]) -> list[dict[str, float]]:
    return [{"step": i + 1, "entropy": v} for i, v in enumerate(values)]


def test_the_figures_of_a_logged_entropy_trace() -> None:
    # falls onto the target, goes 20% under it at step 5, back inside ±10% from step 6 on
    f = control_figures(trace([1.6, 1.3, 1.1, 0.95, 0.8, 0.95, 1.05, 1.0]), TARGET, 0.10)
    assert f["entropy_mae"] == pytest.approx((0.2 + 0.05 + 0.05 + 0.0) / 4)
    assert (f["steps_below"], f["settling_step"]) == (3, 6)
    assert f["overshoot_pct"] == pytest.approx(20.0)
    assert f["final_entropy"] == pytest.approx((0.95 + 0.8 + 0.95 + 1.05 + 1.0) / 5)
    # never reaching the target: no overshoot, never settled, the error of the open loop is the gap
    f = control_figures(trace([1.6, 1.5, 1.4, 1.3]), TARGET, 0.10)
    assert (f["overshoot_pct"], f["settling_step"], f["steps_below"]) == (0.0, None, 0)
    assert f["entropy_mae"] == pytest.approx(0.35)


def test_the_arms_set_the_entropy_term_each_as_declared() -> None:
    from trl import GRPOConfig

    a, _ = rl_entropy.parser().parse_known_args(["--target", "1.2"])
    arms = {x.name: x for x in SPEC.arms()}
    assert [x.name for x in SPEC.arms(quick=True)] == [OPEN, PRESET]
    assert trainer_config(arms[OPEN], a) == {"entropy_coef": 0.0}
    assert trainer_config(arms[FIXED[0]], a) == {"entropy_coef": 0.03}
    assert trainer_config(arms[PRESET], a) == {"entropy_coef": 1e-4}  # TRL computes the term only from non-zero
    trl = trainer_config(arms[TRL], a)
    assert trl == {"use_adaptive_entropy": True, "entropy_target": 1.2, "entropy_coef": 0.0, "entropy_coef_delta": 0.005}
    cfg = GRPOConfig(output_dir="/tmp/unused-rl-entropy", use_cpu=True, report_to=[], **trl)  # TRL 1.16's fields
    assert (cfg.use_adaptive_entropy, cfg.entropy_target, cfg.entropy_coef_delta) == (True, 1.2, 0.005)


def register(url: str, name: str, policy: dict, knob: str, value: float, scale: str) -> dict:
    r = httpx.post(f"{url}/v1/runs", json={"name": name, "policy": policy, "knobs": [
        {"name": knob, "value": value, "scale": scale, "min": value / 10 if scale == "log" else 0.0,
         "max": value * 10 if scale == "log" else 0.1, "max_step": 0.5 if scale == "log" else 0.01}]})
    assert r.status_code == 201, r.text
    return r.json()


def test_the_actuator_arms_run_the_shipped_presets_at_the_scenario_target(sqlite_service) -> None:
    a, _ = rl_entropy.parser().parse_known_args(["--target", "1.3"])
    (c,) = register(sqlite_service.url, "ent", preset_policy(a), "entropy_coef", 1e-4, "linear")["policy"]["controllers"]
    assert (c["probe"], c["knob"], c["setpoint"], c["direction"]) == ("train.entropy", "entropy_coef", 1.3, "direct")
    a, _ = rl_entropy.parser().parse_known_args(["--kp", "0.05", "--ki", "0.004", "--alpha", "0.5"])
    tuned = preset_policy(a)["controllers"][0]
    assert (tuned["kp"], tuned["ki"], tuned["filter"]) == (0.05, 0.004, {"kind": "ema", "alpha": 0.5})

    ka = rl_kl_parser().parse_args(["--arms", "free", "--target", "0.04"])
    (k,) = register(sqlite_service.url, "kl", free_policy(ka), "kl_beta", 0.5, "log")["policy"]["controllers"]
    assert (k["probe"], k["knob"], k["setpoint"], k["direction"]) == ("train.kl", "kl_beta", 0.04, "reverse")
    ka = rl_kl_parser().parse_args(["--arms", "free", "--free-setpoint", "0.08", "--free-kp", "0.5"])
    assert (free_policy(ka)["controllers"][0]["setpoint"], free_policy(ka)["controllers"][0]["kp"]) == (0.08, 0.5)
    assert FREE in {x.name for x in spec("rl-kl").arms()}


def result(arm: str, kind: str, seed: int, values: list[float], reward: float) -> ArmResult:
    metrics = {**control_figures(trace(values), TARGET, 0.1), "reward": reward, "distinct": 4.0, "pass1": 0.3,
               "passk": 0.6}
    return ArmResult(arm, kind, seed, metrics, trace(values), {"target": TARGET})


def test_the_aggregate_judges_the_preset_against_half_trl_adaptive_and_picks_the_fixed_coef_on_seed_0(
        tmp_path: Path) -> None:
    runs = []
    for seed in range(5):
        runs += [result(OPEN, "open", seed, [1.6, 1.2, 0.8, 0.6], 0.2),
                 result(TRL, "trl-adaptive", seed, [1.6, 1.2, 0.9, 0.8], 0.15),
                 result(FIXED[0], "fixed", seed, [1.6, 1.2, 0.9 + 0.01 * seed, 0.85], 0.1),
                 result(FIXED[1], "fixed", seed, [1.6, 1.2, 1.0, 0.95 - 0.3 * (seed == 0)], 0.1),
                 # the preset misses half TRL's error on seed 3 only
                 result(PRESET, "actuator", seed, [1.6, 1.2, 1.0, 0.8 if seed == 3 else 1.0], 0.12)]
    for seed in range(5):
        write_seed(tmp_path / f"rl-entropy-seed{seed}.json", SPEC, seed, [r for r in runs if r.seed == seed])
    back = SPEC.load(sorted(tmp_path.glob("rl-entropy-seed*.json")))
    v = validate(SPEC, back, judged_on=(1, 2, 3, 4))
    err = v.get(PRESET, "entropy_mae")
    assert (err.seeds_met, err.seeds_judged, err.met) == (3, 4, False)  # 4 of 4 asked at four seeds
    assert v.picks[0].picked_on_seed0 == FIXED[0] and v.picks[0].best_in_hindsight == FIXED[1]
    stored = json.loads((tmp_path / "rl-entropy-seed0.json").read_text())
    assert [x["arm"] for x in stored["arms"]] == [OPEN, TRL, FIXED[0], FIXED[1], PRESET]
    assert spec("rl-entropy") is SPEC
