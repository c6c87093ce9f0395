"""benchmarks/control/tune.py, the issue-16 target on the simulated plants: gains from `tune` on a
60-interval step test settle within 1.5x the best hand-tuned gains with overshoot <= 15% on every
seed, and on the drift plant (where no arm settles: the setpoint leaves reach late in the run)
they stay under the budget and reach the band far sooner (BENCHMARKS.md "Gains without a sweep")."""

from __future__ import annotations

import pytest

from benchmarks.control.tune import run


@pytest.fixture(scope="module")
def results() -> dict:
    return run()


@pytest.mark.parametrize("plant", ["first_order_lag", "kl_beta"])
def test_tuned_gains_meet_the_target_on_every_seed(results, plant):
    r = results[plant]
    assert r["target_met"] and r["seeds_met"] == 5, r["rows"]
    for row in r["rows"]:
        assert row["tuned_settling"] <= 1.5 * row["hand_settling"] and row["tuned_overshoot"] <= 15.0


def test_the_first_order_lag_settles_in_about_half_the_hand_grids_time(results):
    for row in results["first_order_lag"]["rows"]:
        assert row["model"] == "fopdt" and row["gain"] == pytest.approx(2.0, rel=0.1)
        assert row["tuned_settling"] <= 0.6 * row["hand_settling"]


def test_the_drift_plant_is_fitted_with_its_drift_and_held_under_the_budget(results):
    r = results["lr_drift"]
    assert r["seeds_budget_met"] == 5
    for row in r["rows"]:
        # the drift term takes the probe's own fall: the gain is near the plant's (~0.9 per ln-unit
        # at the step), not twice it as the plain FOPDT fitted
        assert row["drift"] < 0 and 0.6 <= row["gain"] <= 1.5, row
        assert row["tuned_overshoot"] <= 10.0 and row["tuned_over_budget"] == 0
        assert row["tuned_in_band"] <= 10 and row["tuned_band_intervals"] >= 85
        assert row["hand_band_intervals"] <= 30
