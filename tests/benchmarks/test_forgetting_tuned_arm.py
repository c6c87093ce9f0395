"""benchmarks/control/forgetting.py's tuned arm (issue 16) and results folder, without a model: the
pre-run steps the anchor weight within 20% of the run, and variant results stay out of the arm rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.control.harness import RESULTS, identification_test
from benchmarks.control.forgetting import arms_for, constraint_policy, parser


def test_the_pre_run_steps_the_anchor_weight_from_0_to_its_ceiling_within_a_fifth_of_the_run():
    a = parser().parse_args(["--arms", "tuned", "--anchor-batch", "1"])
    test = identification_test(a, knob="kl_weight")
    assert test == {"knob": "kl_weight", "size": 2.0, "hold": 3, "length": 5}
    assert a.ident_size == a.w_max  # 0 -> the knob's upper bound
    assert a.ident_steps <= 0.2 * a.steps


def test_the_tuned_arm_runs_alone_when_asked_and_tunes_the_hand_policys_controller():
    a = parser().parse_args(["--arms", "tuned"])
    arms = arms_for(a)
    assert [arm["kind"] for arm in arms] == ["tuned"]
    assert arms[0]["lr"] == a.lr and arms[0]["name"] == "Actuator (tuned) (ppl +10%)"
    a.start_ppl = 40.0
    controller = constraint_policy(a)["controllers"][0]
    assert controller["name"] == "capability-budget" and controller["kind"] == "constraint"
    assert controller["knob"] == "kl_weight" and controller["setpoint"] == 44.0
    # the full arm list (no --arms) carries it too, after the hand-tuned Actuator
    kinds = [arm["kind"] for arm in arms_for(parser().parse_args([]))]
    assert kinds.index("tuned") == kinds.index("actuator") + 1


def test_the_anchor_batch_defaults_to_1_and_2_stays_reachable():
    assert parser().parse_args([]).anchor_batch == 1
    assert parser().parse_args(["--anchor-batch", "2"]).anchor_batch == 2


def test_anchor_words_outside_the_shipped_set_are_refused_naming_the_flag(capsys):
    from benchmarks.control.forgetting import main

    assert parser().parse_args(["--anchor-words", "60"]).anchor_words == 60
    for bad in ("121", "-1"):
        with pytest.raises(SystemExit):
            main(["--anchor-words", bad, "--aggregate"])
        assert "--anchor-words must be in [0, 120]" in capsys.readouterr().err


def test_an_actuator_with_another_ceiling_is_named_with_it_so_aggregates_keep_them_apart():
    def name(*args: str) -> str:
        return next(arm["name"] for arm in arms_for(parser().parse_args(list(args))) if arm["kind"] == "actuator")

    assert name() == "Actuator kp 0.5 ki 0.05 (ppl +10%)"
    assert name("--w-max", "4", "--constraint", "answer_kl", "--budget", "0.1") == \
        "Actuator kp 0.5 ki 0.05 w ≤ 4 (answer_kl ≤ 0.1)"


def test_results_go_to_benchmarks_results_unless_a_subfolder_is_named():
    assert parser().parse_args([]).results == RESULTS
    a = parser().parse_args(["--results", "benchmarks/results/forgetting-batch1"])
    assert a.results == Path("benchmarks/results/forgetting-batch1")


def _seed_file(folder: Path, seed: int, arms: dict[str, tuple[float, float, float]]) -> None:
    """One per-seed result: arm -> (task accuracy, kl_drift, answer_kl)."""
    import json

    rows = []
    for name, (acc, kl, akl) in arms.items():
        kind = "fixed" if name.startswith("fixed") else "open" if name.startswith("open") else "actuator"
        metrics = {"task_accuracy": acc, "task_gain": 0.1, "ppl_rise_pct": 5.0, "gold_logprob_drop": 0.3,
                   "embedding_drift": 0.4, "kl_drift": kl, "hotpotqa_f1": 0.2, "answer_kl": akl}
        rows.append({"arm": name, "kind": kind, "seed": seed, "metrics": metrics, "trace": [], "seconds_per_step": 3.0,
                     "constraint": {"probe": "answer_kl", "budget": 0.1, "ceiling": 0.1}})
    (folder / f"forgetting-seed{seed}-t.json").write_text(json.dumps(
        {"seed": seed, "lr": 9e-5, "steps": 40, "budget": 0.1, "start": {}, "arms": rows, "command": "c",
         "machine": {}}))


def test_a_budget_on_answer_kl_is_judged_on_answer_kl(tmp_path):
    from benchmarks.control.forgetting import aggregate

    # w=0.3 keeps KL drift low but not the answers' onset; w=1 holds answer_kl inside its 0.1 budget
    for seed in (0, 1, 2):
        _seed_file(tmp_path, seed, {"open loop 9e-05": (0.5, 0.9, 1.2), "fixed w=0.3": (0.45, 0.05, 0.6),
                                    "fixed w=1": (0.3, 0.8, 0.08), "Actuator": (0.32, 0.7, 0.09)})
    out = aggregate("-t", tmp_path)
    t = out["targets"]["Actuator"]
    assert t["fixed_w_picked_on_seed0"] == "fixed w=1"  # the only fixed w inside the answer_kl budget
    assert t["matches_fixed_w_picked_on_seed0"]["actuator_meets_budget"] is True
    assert out["rows"]["Actuator"]["answer_kl"] == pytest.approx((0.09, 0.0))
    assert "answer_kl" in t["on_or_beyond_open_loop_pareto_front"]["axes"]
    assert (tmp_path / "forgetting-t.json").is_file()


def test_the_open_loop_runs_at_the_fractions_of_the_rate_asked_and_the_end_kept_is_the_one_at_the_rate(capsys):
    from benchmarks.control.forgetting import main

    def opens(*args: str) -> list[tuple[str, float, bool]]:
        return [(arm["name"], arm["lr"], bool(arm.get("keep_end")))
                for arm in arms_for(parser().parse_args(["--arms", "open", *args])) if arm["kind"] == "open"]

    assert opens() == [("open loop 1e-05", 1e-5, False), ("open loop 3e-05", 3e-5, False),
                       ("open loop 9e-05", 9e-5, True)]
    assert opens("--open-lrs", "1") == [("open loop 9e-05", 9e-5, True)]
    assert opens("--open-lrs", "0.5", "--lr", "2e-4") == [("open loop 1e-04", 1e-4, False)]
    with pytest.raises(SystemExit):
        main(["--open-lrs", "0", "--aggregate"])
    assert "--open-lrs must be positive fractions of --lr" in capsys.readouterr().err
