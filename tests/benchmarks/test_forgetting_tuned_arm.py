"""benchmarks/control/forgetting.py's tuned arm (issue 16) and results folder, without a model: the
pre-run steps the anchor weight within 20% of the run, and variant results stay out of the arm rows."""

from __future__ import annotations

from pathlib import Path

from benchmarks.control._common import RESULTS, identification_test
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


def test_results_go_to_benchmarks_results_unless_a_subfolder_is_named():
    assert parser().parse_args([]).results == RESULTS
    a = parser().parse_args(["--results", "benchmarks/results/forgetting-batch1"])
    assert a.results == Path("benchmarks/results/forgetting-batch1")
