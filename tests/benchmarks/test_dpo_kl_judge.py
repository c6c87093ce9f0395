"""dpo-kl's aggregate under issue 40's protocol, on synthetic per-seed files (no model is loaded):
the fixed learning rate is picked on seed 0 and judged on seeds 1–4, a restoring arm is named by
the variant its file's policy records, and each closed-loop arm gets the four targets under the
4-of-5 rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.control import dpo_kl

TARGET, STEPS = 0.1, 40


def run(arm: str, kind: str, seed: int, final: float, *, over: float = 0.0, settle: int | None = None,
        margin: float = 5.0) -> dict:
    trace = [{"step": 0, "kl_drift": 0.0, "beta": 0.1, "lr": 1e-5, "w": 0.0},
             {"step": STEPS, "kl_drift": final, "beta": 0.1, "lr": 1e-5, "w": 0.0}]
    return {"arm": arm, "kind": kind, "loss_type": "sigmoid", "seed": seed, "trace": trace,
            "margins": [{"step": STEPS, "margin": margin}], "settling_step": settle, "overshoot_pct": over,
            "final_kl": final, "reward_margin": margin}


def write(folder: Path, name: str, arms: list[dict], predict: float = 0.0) -> None:
    a = dpo_kl.parser().parse_args(["--predict", str(predict)] if predict else [])
    configs = {"sigmoid": {"restoring": {"lr+anchor": dpo_kl.restoring_policy(a, "lr+anchor")}}}
    (folder / f"dpo-kl-{name}.json").write_text(json.dumps(
        {"steps": STEPS, "target": TARGET, "band": 0.1, "lr": 1e-5, "configs": configs, "arms": arms}))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    seeds = range(5)
    # fixed rates: 3e-6 ends nearest the target on seed 0 (the pick); 2e-6 is nearer on seeds 1-4
    write(tmp_path, "flr-s", [run("fixed lr 2e-06", "fixed-lr", s, 0.080 if s == 0 else 0.098, margin=3.0)
                              for s in seeds] +
          [run("fixed lr 3e-06", "fixed-lr", s, 0.095 if s == 0 else 0.130, margin=[5.0, 5.0, 6.0, 4.0, 5.0][s])
           for s in seeds])
    write(tmp_path, "zk-s", [run("Ziegler adaptive KL", "ziegler", s, 0.6, over=500) for s in seeds])
    # the preset: overshoot 11% everywhere, settles on 4 of 5; the predictive variant: 20% on seed 3
    write(tmp_path, "restoring-s", [run("Actuator lr + anchor", "lr+anchor", s, 0.110, over=11.0,
                                        settle=None if s == 3 else 30, margin=4.9) for s in seeds])
    write(tmp_path, "predict-s", [run("Actuator lr + anchor", "lr+anchor", s, 0.100, over=20.0 if s == 3 else 5.0,
                                      settle=20, margin=3.0) for s in seeds], predict=2.0)
    return tmp_path


def test_the_fixed_rate_is_picked_on_seed_0_and_the_laws_are_judged_against_it(results: Path) -> None:
    out = dpo_kl.aggregate("issue40", results, tags=["flr", "zk", "restoring", "predict"])
    laws = out["law_targets"]["sigmoid"]
    assert laws["fixed_pick"]["picked_on_seed0"] == "fixed lr 3e-06"
    assert laws["fixed_pick"]["best_in_hindsight"] == "fixed lr 2e-06"
    assert set(laws["arms"]) == {"Actuator lr + anchor", "Actuator lr + anchor (predict 2)"}  # named by variant
    preset, predict = laws["arms"]["Actuator lr + anchor"], laws["arms"]["Actuator lr + anchor (predict 2)"]

    assert preset["overshoot_at_most_15pct"]["met"] and preset["overshoot_at_most_15pct"]["seeds_held"] == 5
    # 20% on one seed of five, 7% on the mean: met by the 4-of-5 rule
    assert predict["overshoot_at_most_15pct"]["met"] and predict["overshoot_at_most_15pct"]["seeds_held"] == 4
    # Ziegler never settles: settling within the run is the bar; the preset misses it on seed 3 (4 of 5
    # held), but a run that never settles counts steps + 1 and drags the mean over the run's length
    settle = preset["settles_in_half_ziegler_steps"]
    assert settle["seeds_held"] == 4 and settle["limit_on_mean"] == STEPS and settle["met"]
    # judged on seeds 1-4 against the pick's |0.130 - 0.1| = 0.03: 0.01 and 0.0 are both nearer
    assert preset["final_error_no_worse_than_fixed_pick"]["held_per_seed"] == {str(s): True for s in (1, 2, 3, 4)}
    # margins: the pick's 5, 6, 4, 5 on seeds 1-4 (sd 0.816); 4.9 is within one sd on 3 of 4, 3.0 on none
    margin = preset["reward_margin_within_one_sd_of_fixed_pick"]
    assert margin["pick_margin_sd"] == pytest.approx(0.8165, abs=1e-4)
    assert margin["held_per_seed"] == {"1": True, "2": False, "3": True, "4": True} and not margin["met"]
    assert not predict["reward_margin_within_one_sd_of_fixed_pick"]["met"]
    assert (results / "dpo-kl-aggregate-issue40.json").exists() and (results / "dpo-kl-aggregate-issue40.png").exists()


def test_without_fixed_rate_runs_only_the_targets_that_need_none_are_judged(results: Path) -> None:
    out = dpo_kl.aggregate("issue40", results, tags=["zk", "restoring"])
    laws = out["law_targets"]["sigmoid"]
    assert laws["fixed_pick"] == {}
    assert set(laws["arms"]["Actuator lr + anchor"]) == {"overshoot_at_most_15pct", "settles_in_half_ziegler_steps"}
