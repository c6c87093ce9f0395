"""Control-quality regression on the seeded plants, the plants' physics, and import hygiene."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from actuator.controllers import FixedSchedule

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks.control.plants import (  # noqa: E402
    FixedArm,
    KLBetaPlant,
    LRDriftPlant,
    compare,
    kl_scenario,
    lr_scenario,
    grpo_kl_scenario,
    rl_kl_scenario,
    run_arm,
)

SEEDS = range(5)  # the gains in plants.py were tuned on seeds 100..104


@pytest.fixture(scope="module")
def kl_results():
    return compare(kl_scenario(), SEEDS)


@pytest.fixture(scope="module")
def lr_results():
    return compare(lr_scenario(), SEEDS, budget=LRDriftPlant().budget)


def test_pid_settles_kl_at_least_twice_as_fast_as_the_adaptive_controller(kl_results) -> None:
    for pid, ziegler in zip(kl_results["pid"], kl_results["adaptive_kl"]):
        assert pid["settling"] is not None and ziegler["settling"] is not None
        assert pid["settling"] <= ziegler["settling"] / 2
        assert pid["overshoot_pct"] <= 15.0
        assert abs(pid["ss_error"]) < 0.05 * 6.0
    assert all(r["settling"] is None for r in kl_results["fixed_beta"])  # the plant needs control


def test_rl_kl_plant_keeps_what_the_real_run_measured() -> None:
    """The plant fitted to the real rl-kl traces (RLOO, SmolLM2-135M, 24 steps = 12 intervals)
    reproduces what the real run showed: neither controller settles in that run, and the PID ends
    nearer the target than Ziegler's adaptive controller on every seed (measured: |KL − target|
    0.025 ± 0.018 vs 0.057 ± 0.029 over 3 seeds), with a lower peak. Given five times the steps the
    PID settles on every seed and Ziegler's on at most one (the plant's prediction for a longer run)."""
    short = compare(rl_kl_scenario(12), SEEDS)
    for pid, ziegler in zip(short["pid"], short["adaptive_kl"]):
        assert pid["settling"] is None and ziegler["settling"] is None
        assert abs(pid["ss_error"]) < abs(ziegler["ss_error"])
        assert pid["overshoot_pct"] < ziegler["overshoot_pct"]
    long = compare(rl_kl_scenario(60), SEEDS)
    assert all(r["settling"] is not None for r in long["pid"])
    assert sum(r["settling"] is not None for r in long["adaptive_kl"]) <= 1
    assert all(r["settling"] is None for r in long["fixed_beta"])


def test_pid_spends_fewer_steps_over_the_drift_budget(lr_results) -> None:
    for k in range(len(SEEDS)):
        pid = lr_results["pid"][k]
        for baseline in ("fixed_lr", "plateau_val_loss", "plateau_drift"):
            assert pid["over_budget"] < lr_results[baseline][k]["over_budget"], baseline
        # and not by giving up on learning: the run ends where the fixed LR ends
        assert pid["final_val_loss"] <= lr_results["fixed_lr"][k]["final_val_loss"] + 0.02
        assert pid["final_val_loss"] < lr_results["plateau_drift"][k]["final_val_loss"]
    assert all(r["over_budget"] > 20 for r in lr_results["fixed_lr"])  # the budget really binds


def test_runs_are_deterministic_per_seed() -> None:
    sc = lr_scenario()
    a = run_arm(sc.plant_factory(), sc.arms[0], 100, seed=42)
    b = run_arm(sc.plant_factory(), sc.arms[0], 100, seed=42)
    c = run_arm(sc.plant_factory(), sc.arms[0], 100, seed=43)
    assert a.knob == b.knob and a.measured == b.measured
    assert a.measured != c.measured


# -- the plants behave like the runs they model --------------------------------------------------


def test_kl_grows_when_beta_is_small() -> None:
    finals = []
    for beta in (0.05, 0.1, 0.2):
        plant = KLBetaPlant(pressure_growth=0.0, initial_knob=beta)
        t = run_arm(plant, FixedArm("f", FixedSchedule.constant(beta)), 100, seed=0)
        assert t.true[0] < t.true[10] < t.true[-1]  # starts at the reference, grows
        finals.append(t.true[-1])
    assert finals[0] > finals[1] > finals[2]
    assert finals[1] / finals[2] == pytest.approx(4.0, rel=0.01)  # KL ~ 1 / beta**2
    # the probe reports the previous batch
    assert t.measured[0] == pytest.approx(0.0, abs=0.2)


def test_drift_accumulates_with_learning_progress_and_costs_more_at_high_lr() -> None:
    slow = run_arm(LRDriftPlant(initial_knob=1e-4), FixedArm("slow", FixedSchedule.constant(1e-4)), 200, seed=0)
    fast = run_arm(LRDriftPlant(), FixedArm("fast", FixedSchedule.constant(2e-4)), 100, seed=0)
    # same learning progress (sum of LR) at the end of each: same loss from the task part...
    assert slow.extras["true_val_loss"][-1] - 0.05 * 1 == pytest.approx(fast.extras["true_val_loss"][-1] - 0.05 * 2)
    # ...but the fast run paid more drift on the way, and drift grew with progress early on
    assert max(fast.true) > max(slow.true)
    assert all(a < b for a, b in zip(slow.true[:20], slow.true[1:21]))
    # a barely moving run barely drifts
    idle = run_arm(LRDriftPlant(initial_knob=1e-6), FixedArm("idle", FixedSchedule.constant(1e-6)), 100, seed=0)
    assert max(idle.true) < 0.02


# -- controllers/ stays standard-library only ----------------------------------------------------


def test_controllers_import_only_the_standard_library_and_themselves() -> None:
    forbidden = {"torch", "numpy", "logging", "time"}
    for path in (_ROOT / "controllers").glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level > 0:
                    continue  # relative: our own package
                names = [(node.module or "").split(".")[0]]
            else:
                continue
            for name in names:
                assert name not in forbidden, f"{path.name} imports {name}"
                assert name in sys.stdlib_module_names or name == "__future__", f"{path.name} imports {name}"


def test_grpo_kl_plant_keeps_what_the_real_run_measured() -> None:
    """The plant fitted to the real GRPO rl-kl traces (SmolLM2-135M, 24 steps = 12 intervals, every
    arm from the feedforward β₀) keeps what the real run showed on every seed: the PID's peak is
    under half of Ziegler's (measured 14/14/39% vs 83/43/89%), Ziegler's overshoots by more than
    50%, the fixed β₀ runs away, and the PID ends within 20% of the target (measured 0.0059,
    0.0023, 0.0024 for 0.04). The plant is stationary and settles the PID within 12 intervals on
    most seeds, which the real run did not (a slow oscillation, BENCHMARKS.md): settling is not
    asserted from it."""
    res = compare(grpo_kl_scenario(12), SEEDS)
    target = 0.04
    for pid, ziegler, fixed in zip(res["pid"], res["adaptive_kl"], res["fixed_beta"]):
        assert pid["overshoot_pct"] < ziegler["overshoot_pct"] / 2
        assert ziegler["overshoot_pct"] > 50.0
        assert fixed["overshoot_pct"] > 100.0
        assert abs(pid["ss_error"]) < 0.2 * target


def test_restoring_fit_recovers_the_grpo_plant_it_simulates() -> None:
    """``fit_restoring_kl`` on traces of :class:`GRPOKLPlant` itself (β steps, the probe's noise)
    recovers push and pull within 20%, exactly without noise; too little data is refused."""
    import random

    from benchmarks.control.plants import GRPOKLPlant, fit_restoring_kl

    def traces(noise: float) -> list[list[tuple[float, float, float]]]:
        out = []
        for seed, betas in enumerate(([0.3] * 6 + [2.0] * 6, [1.0] * 12, [3.0] * 4 + [0.5] * 8)):
            plant = GRPOKLPlant(push=0.01, pull=0.2, noise_sd=noise)
            plant.reset(random.Random(seed))
            trace = [(0.0, 0.0, betas[0])]
            for i, b in enumerate(betas, start=1):
                trace.append((2.0 * i, plant.step(b).measurement, b))
            out.append(trace)
        return out

    exact = fit_restoring_kl(traces(0.0))
    assert exact.push == pytest.approx(0.01, rel=1e-4) and exact.pull == pytest.approx(0.2, rel=1e-4)
    assert exact.r2 == pytest.approx(1.0)
    noisy = fit_restoring_kl(traces(0.002))
    assert noisy.push == pytest.approx(0.01, rel=0.2) and noisy.pull == pytest.approx(0.2, rel=0.2)
    assert noisy.equilibrium(1.0) == pytest.approx(0.05, rel=0.25)
    with pytest.raises(ValueError, match="traces"):
        fit_restoring_kl([[(0.0, 0.0, 1.0), (2.0, 0.02, 1.0)]])
