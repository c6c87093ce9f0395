"""The published figures re-aggregated through the contract (issue 53): each scenario's declared
metrics, read by the one loader from the result files benchmarks/README.md cites, give the
figures that page quotes (over the seeds it quotes them on, 0–4; the validation split quotes 1–9
once seeds 5–9 have run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.control.contract import Validation, tagged_files, validate
from benchmarks.control.validate import main, spec

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
README = (RESULTS.parent / "README.md").read_text()


def published(scenario: str, *, tags: list[str] | None = None, files: list[str] | None = None,
              results: Path = RESULTS, seeds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> Validation:
    s = spec(scenario)
    found = [RESULTS / f for f in files or []] + (tagged_files(results, scenario, tags) if tags else [])
    return validate(s, s.load(found), judged_on=seeds)


def ms(v: Validation, arm: str, metric: str, digits: int) -> str:
    f = v.get(arm, metric)
    assert f.mean is not None and f.sd is not None
    return f"{f.mean:.{digits}f} ± {f.sd:.{digits}f}"


def quoted(v: Validation, arm: str, metric: str, digits: int) -> tuple[str, str, int | None, int | None]:
    """A figure as the README quotes it: mean ± sd, the worst seed's value and number, the seeds met."""
    f = v.get(arm, metric)
    return ms(v, arm, metric, digits), f"{f.worst:.{digits}f}", f.worst_seed, f.seeds_met


def test_dpo_kl_issue40_the_preset_and_the_fixed_pick() -> None:
    v = published("dpo-kl", files=["dpo-kl-aggregate-issue40.json"])
    ramp = v.get("Actuator lr + anchor (ramp 8)", "overshoot_pct")
    assert ms(v, "Actuator lr + anchor (ramp 8)", "overshoot_pct", 1) == "2.8 ± 0.9"
    assert (round(ramp.worst or 0, 1), ramp.worst_seed) == (3.7, 1)
    assert "**2.8 ± 0.9%** | 3.7% (seed 1) | **0.1010 ± 0.0009**" in README
    assert ms(v, "Actuator lr + anchor (ramp 8)", "final_kl", 4) == "0.1010 ± 0.0009"
    assert ms(v, "fixed lr 2e-06", "overshoot_pct", 1) == "36.4 ± 1.9"
    assert v.get("Actuator lr + anchor (ramp 8)", "settled").seeds_met == 5
    on_1_4 = published("dpo-kl", files=["dpo-kl-aggregate-issue40.json"], seeds=(1, 2, 3, 4))
    p = on_1_4.picks[0]
    assert (p.picked_on_seed0, p.best_in_hindsight) == ("fixed lr 2e-06", "fixed lr 2e-06")
    err = on_1_4.get("Actuator lr + anchor (ramp 8)", "abs_error")
    assert (f"{err.mean:.4f}", f"{p.picked_mean:.4f}", err.seeds_met) == ("0.0012", "0.0249", 4)
    assert "0.0012 vs 0.0249 (4 of 4)" in README


def test_sft_drift_issue37_the_pid_against_the_open_loop() -> None:
    v = published("sft-drift", files=["sft-drift-aggregate-issue37.json"])
    assert ms(v, "actuator PID", "final_kl_drift", 3) == "1.815 ± 0.005"
    assert ms(v, "open loop 3.0e-05", "final_kl_drift", 2) == "6.51 ± 0.11"
    drift = v.get("actuator PID", "final_kl_drift")
    assert (drift.seeds_met, drift.met) == (5, True)
    # the fresh seeds 5-9: over seeds 1-9 from the kept per-seed files, as benchmarks/README quotes it
    nine = published("sft-drift", files=["sft-drift-aggregate-issue37.json",
                                         *(f"sft-drift-seed{n}.json" for n in range(1, 10))], seeds=tuple(range(1, 10)))
    f9 = nine.get("actuator PID", "final_kl_drift")
    assert ms(nine, "actuator PID", "final_kl_drift", 3) == "1.818 ± 0.005"
    assert ms(nine, "open loop 3.0e-05", "final_kl_drift", 3) == "6.437 ± 0.125"
    assert (f9.seeds_met, f9.met, f9.provisional, f9.disagreement) == (9, True, False, [])
    assert "drift **1.818 ± 0.005** against the open loop's 6.437 ± 0.125: **0.28×**" in " ".join(README.split())
    assert (round(drift.worst or 0, 3), drift.worst_seed) == (1.820, 1)
    assert v.get("actuator PID", "task_gain").seeds_met == 0
    assert "**1.815 ± 0.005** | 1.820 (seed 1)" in README


def test_forgetting_answers_only_the_actuator_against_the_open_loop() -> None:
    v = published("forgetting", tags=["-co-akl01-5s"], results=RESULTS / "forgetting-answer-kl")
    act = "Actuator kp 0.5 ki 0.05 (answer_kl ≤ 0.1)"
    assert quoted(v, act, "task_accuracy", 2) == ("0.41 ± 0.12", "0.26", 0, 3)
    assert v.get(act, "task_accuracy").met is False
    assert ms(v, "open loop 9e-05", "task_accuracy", 2) == "0.43 ± 0.14"
    assert ms(v, "Actuator kp 0.5 ki 0.05 (answer_kl ≤ 0.1)", "answer_kl", 2) == "0.26 ± 0.04"
    assert v.get("Actuator kp 0.5 ki 0.05 (answer_kl ≤ 0.1)", "answer_kl").seeds_met == 0
    assert "**0.41 ± 0.12** | 0.26 (seed 0)" in README


def test_compress_w200_kdt_the_width_pid() -> None:
    v = published("compress-rank", tags=["-w200-kdt"])
    assert quoted(v, "Actuator PID on channel τ", "size_pct", 1) == ("83.6 ± 1.2", "84.7", 1, 5)
    assert "**83.6 ± 1.2%**, worst 84.7% (seed 1)" in README


def test_rl_kl_g24_the_pid_with_prediction_and_the_fixed_beta_pick() -> None:
    v = published("rl-kl", files=["rl-kl-x-g24.json"])
    over = v.get("actuator PID (predict 2)", "overshoot_pct")
    assert quoted(v, "actuator PID (predict 2)", "overshoot_pct", 1) == ("7.6 ± 16.9", "37.9", 2, 4)
    # the published "met (4 of 5 and the mean)" was the 4-of-5 rule; the split asks 8 of 9 (5 of 5 here)
    assert over.met is False and over.met_on_mean is True
    on_1_4 = published("rl-kl", files=["rl-kl-x-g24.json"], seeds=(1, 2, 3, 4))
    err = on_1_4.get("actuator PID (predict 2)", "abs_error")
    assert (on_1_4.picks[0].picked_on_seed0, f"{err.mean:.4f}", f"{on_1_4.picks[0].picked_mean:.4f}",
            err.seeds_met) == ("fixed β 2", "0.0058", "0.0085", 2)
    # Seeds 0-4 alone were the published figure; with the fresh seeds 5-9 (their per-seed files kept)
    # the README quotes seeds 1-9, met under the 8-of-9 rule, the fresh seeds' disagreement said.
    fresh = [f"rl-kl-x-g24-p{n}-grpo-seed{n}.json" for n in range(5, 10)]
    nine = published("rl-kl", files=["rl-kl-x-g24.json", *fresh], seeds=tuple(range(1, 10)))
    over9 = nine.get("actuator PID (predict 2)", "overshoot_pct")
    assert quoted(nine, "actuator PID (predict 2)", "overshoot_pct", 1) == ("5.2 ± 12.4", "37.9", 2, 8)
    assert over9.met is True and over9.disagreement == ["target missed on seeds 1-4, met on 5-9"]
    assert "**5.2 ± 12.4%** over seeds 1–9, range 0–37.9%, worst 37.9% (seed 2)" in README


@pytest.mark.parametrize("args", [
    ["dpo-kl", "--from", "benchmarks/results/dpo-kl-aggregate-issue40.json", "--tags", "ramp", "flr"],
    ["sft-drift", "--from", "benchmarks/results/sft-drift-aggregate-issue37.json", "--tags", "seed"],
    ["forgetting", "--results", "benchmarks/results/forgetting-answer-kl", "--tags=-co-akl01-5s"],
])
def test_the_documented_validation_commands_read_the_kept_files(args: list[str], monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The commands benchmarks/README.md gives the lead for seeds 5–9 run on today's files (the
    per-seed files of seeds 5–9 are added by the runs); ``dpo-kl``'s tags find no file here (its
    per-seed files are not tracked) and are left to the aggregate that keeps every run."""
    monkeypatch.chdir(RESULTS.parents[1])
    if args[0] == "dpo-kl":
        args = args[:3]
    v = main([*args, "--no-write"])
    out = capsys.readouterr().out
    assert "figures over seeds [1, 2, 3, 4, 5, 6, 7, 8, 9]" in out and v.judged_on == list(range(1, 10))
    # seeds 5-9 of dpo-kl are in its aggregate's runs only; those of forgetting not run yet; sft-drift's all kept
    assert all(f.provisional != (args[0] == "sft-drift") for f in v.figures if f.target is not None)
    cmd = " ".join(["python -m benchmarks.control.validate", *args])
    assert cmd.split(" --tags")[0] in " ".join(README.replace("\\\n", " ").split())


def test_a_dpo_kl_per_seed_file_names_its_restoring_arm_with_the_variant_its_policy_records(tmp_path: Path) -> None:
    """Seeds 5–9 of the preset come as per-seed files (``--tag ramp-sN``) whose arm is named
    "Actuator lr + anchor" and whose ``configs`` record the ramp: the loader names it as the
    issue-40 aggregate does, so the fresh seeds join seeds 0–4 of the same arm."""
    import json

    policy = {"controllers": [{"name": "kl-anchor", "setpoint": 0.1}, {"name": "kl-lr", "setpoint_ramp": 8}]}
    run = {"arm": "Actuator lr + anchor", "kind": "lr+anchor", "loss_type": "sigmoid", "seed": 5,
           "overshoot_pct": 10.0, "final_kl": 0.1098, "settling_step": 40, "reward_margin": 4.1, "trace": []}
    (tmp_path / "dpo-kl-ramp-s5.json").write_text(json.dumps(
        {"configs": {"sigmoid": {"restoring": {"lr+anchor": [policy]}}}, "arms": [run]}))
    s = spec("dpo-kl")
    runs = s.load([RESULTS / "dpo-kl-aggregate-issue40.json", *tagged_files(tmp_path, "dpo-kl", ["ramp"])])
    v = validate(s, runs)
    f = v.get("Actuator lr + anchor (ramp 8)", "overshoot_pct")
    assert f.seeds == [1, 2, 3, 4, 5] and f.per_seed[5] == 10.0 and f.worst_seed == 5
    assert f.disagreement and f.disagreement[0].startswith("mean 10 on seeds 5-9 outside 2.995 ± 2×0.91 of seeds 1-4")


def test_the_validation_file_keeps_its_runs_and_re_aggregates_alone(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The per-seed files of seeds 5–9 are not tracked: the validation file they give is enough to
    quote the figures again, and gives the same ones (dpo-kl: the restoring arm keeps its name)."""
    first = main(["dpo-kl", "--from", str(RESULTS / "dpo-kl-aggregate-issue40.json"), "--results", str(tmp_path),
                  "--name", "t"])
    out = tmp_path / "dpo-kl-validation-t.json"
    assert out.exists() and (tmp_path / "dpo-kl-validation-t.png").read_bytes()[:4] == b"\x89PNG"
    again = main(["dpo-kl", "--from", str(out), "--no-write"])
    capsys.readouterr()
    assert [(f.arm, f.metric, f.mean, f.seeds_met) for f in again.figures] == \
        [(f.arm, f.metric, f.mean, f.seeds_met) for f in first.figures]
    assert again.get("Actuator lr + anchor (ramp 8)", "overshoot_pct").per_seed == \
        first.get("Actuator lr + anchor (ramp 8)", "overshoot_pct").per_seed
