"""benchmarks/control/contract.py, the scenario contract and the validation split (issue 53), on a
synthetic scenario (no model): a scenario declares its task, arms and metrics and runs one arm on
one seed; the contract runs the seeds, writes the files, picks on seed 0, judges over seeds 1–9
(met on >= 8 of 9 and the mean), flags fresh seeds that disagree with seeds 1–4, plots, and reads
older files through one loader."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.control import contract
from benchmarks.control.contract import Arm, ArmResult, Declared, Metric, Pick, load_results, validate

# The synthetic plant: each arm's overshoot on each seed, chosen so that the tests can tell a
# right verdict from a wrong one. "preset" meets "≤ 15%" on 8 of 9 judged seeds; "fixed a" is the
# best fixed setting on seed 0 only, "fixed b" on seeds 1–9.
OVERSHOOT = {
    "preset": [99.0, 3.0, 2.0, 4.0, 3.0, 2.0, 40.0, 3.0, 2.0, 4.0],
    "fixed a": [10.0, 30.0, 31.0, 29.0, 30.0, 32.0, 30.0, 31.0, 29.0, 30.0],
    "fixed b": [12.0, 20.0, 21.0, 19.0, 20.0, 22.0, 20.0, 21.0, 19.0, 20.0],
}


def toy(table: dict[str, list[float]] | None = None, calls: list[tuple[int, str]] | None = None) -> Declared:
    values = table or OVERSHOOT

    def runner(seed: int, arm: Arm) -> ArmResult:
        if calls is not None:
            calls.append((seed, arm.name))
        v = values[arm.name][seed]
        return ArmResult(arm.name, arm.kind, seed, {"overshoot_pct": v},
                         trace=[{"step": s, "kl": v * s / 10} for s in range(4)], record={"gain": arm.params["gain"]})

    return Declared(
        name="toy", task="a synthetic plant",
        arm_list=[Arm("preset", "pid", {"gain": 1}), Arm("fixed a", "fixed", {"gain": 2}),
                  Arm("fixed b", "fixed", {"gain": 3})],
        quick=("preset",),
        metrics=[Metric("overshoot_pct", "min", "%", target=15.0, judge=("preset",)),
                 Metric("vs_pick", "min", "%", target=1.0, relative_to="pick:fixed", judge=("preset",),
                        read=lambda r: r["overshoot_pct"])],
        picks=[Pick("fixed", "overshoot_pct", ("fixed a", "fixed b"))], plots=("kl",), runner=runner)


def test_run_writes_one_file_per_seed_and_the_loader_reads_back_the_same_results(tmp_path: Path) -> None:
    s = toy()
    runs = contract.run(s, range(10), tmp_path)
    assert sorted(p.name for p in tmp_path.glob("toy-seed*.json")) == sorted(f"toy-seed{i}.json" for i in range(10))
    stored = json.loads((tmp_path / "toy-seed6.json").read_text())
    assert [a["arm"] for a in stored["arms"]] == ["preset", "fixed a", "fixed b"]
    assert stored["arms"][0]["overshoot_pct"] == 40.0 and stored["arms"][2]["gain"] == 3
    back = load_results(s, sorted(tmp_path.glob("toy-seed*.json")))
    assert {(r.arm, r.seed): r.metrics["overshoot_pct"] for r in back} == \
        {(r.arm, r.seed): r.metrics["overshoot_pct"] for r in runs}
    assert next(r for r in back if (r.arm, r.seed) == ("preset", 6)).trace[3] == {"step": 3, "kl": 12.0}


def test_a_seed_file_is_rewritten_after_every_arm(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    s = toy()
    inner = s.runner
    assert inner is not None

    def spy(seed: int, arm: Arm) -> ArmResult:
        f = tmp_path / f"toy-seed{seed}.json"
        seen.append([a["arm"] for a in json.loads(f.read_text())["arms"]] if f.exists() else [])
        return inner(seed, arm)

    s.runner = spy
    contract.run(s, [0], tmp_path)
    assert seen == [[], ["preset"], ["preset", "fixed a"]]


def test_the_pick_is_made_on_seed_0_and_judged_on_seeds_1_to_9_beside_the_best_in_hindsight(tmp_path: Path) -> None:
    s = toy()
    v = validate(s, contract.run(s, range(10), tmp_path))
    p = v.picks[0]
    assert (p.picked_on_seed0, p.best_in_hindsight) == ("fixed a", "fixed b")
    assert p.judged_on == list(range(1, 10))
    assert p.picked_mean == sum(OVERSHOOT["fixed a"][1:]) / 9 and p.hindsight_mean == sum(OVERSHOOT["fixed b"][1:]) / 9
    # the relative target compares with the arm picked on seed 0, not with the best in hindsight
    vs = v.get("preset", "vs_pick")
    assert vs.relative_to == "pick:fixed" and vs.seeds_met == 8 and vs.met


def test_figures_are_quoted_over_seeds_1_to_9_with_the_range_and_the_worst_seed(tmp_path: Path) -> None:
    s = toy()
    f = validate(s, contract.run(s, range(10), tmp_path)).get("preset", "overshoot_pct")
    assert f.seeds == list(range(1, 10)) and 0 not in f.per_seed  # seed 0 (99%) is the choice seed
    assert f.mean == sum(OVERSHOOT["preset"][1:]) / 9
    assert (f.low, f.high, f.worst_seed, f.worst) == (2.0, 40.0, 6, 40.0)


def test_a_target_is_met_on_8_of_9_seeds_and_the_mean_and_missed_on_7_or_off_the_mean(tmp_path: Path) -> None:
    s = toy()
    eight = validate(s, contract.run(s, range(10), tmp_path / "8")).get("preset", "overshoot_pct")
    assert (eight.seeds_met, eight.seeds_needed, eight.met_on_mean, eight.met, eight.provisional) == \
        (8, 8, True, True, False)
    seven = {**OVERSHOOT, "preset": [3.0, 3.0, 2.0, 4.0, 30.0, 2.0, 40.0, 3.0, 2.0, 4.0]}
    f7 = validate(s, contract.run(toy(seven), range(10), tmp_path / "7")).get("preset", "overshoot_pct")
    assert (f7.seeds_met, f7.met_on_mean, f7.met) == (7, True, False)
    off_mean = {**OVERSHOOT, "preset": [3.0, 3.0, 2.0, 4.0, 3.0, 2.0, 400.0, 3.0, 2.0, 4.0]}
    fm = validate(s, contract.run(toy(off_mean), range(10), tmp_path / "m")).get("preset", "overshoot_pct")
    assert (fm.seeds_met, fm.met_on_mean, fm.met) == (8, False, False)
    assert contract.verdict_text(fm) == "missed (8 of 9, not on the mean)"


def test_with_fewer_seeds_the_same_share_is_asked_and_the_verdict_is_provisional(tmp_path: Path) -> None:
    s = toy()
    f = validate(s, contract.run(s, range(5), tmp_path)).get("preset", "overshoot_pct")
    assert (f.seeds, f.seeds_met, f.seeds_needed, f.met, f.provisional) == ([1, 2, 3, 4], 4, 4, True, True)
    assert contract.verdict_text(f) == "met (4 of 4, provisional)"


def test_fresh_seeds_that_disagree_with_seeds_1_to_4_are_flagged_in_the_aggregate_and_the_table(tmp_path: Path) -> None:
    drifting = {**OVERSHOOT, "preset": [2.0, 2.8, 3.7, 1.7, 2.9, 10.0, 7.0, 9.0, 8.0, 9.5]}
    s = toy(drifting)
    v = validate(s, contract.run(s, range(10), tmp_path))
    f = v.get("preset", "overshoot_pct")
    assert f.met  # every seed under 15%: met, and yet the fresh seeds are far outside seeds 1-4's spread
    assert len(f.disagreement) == 1 and f.disagreement[0].startswith("mean 8.7 on seeds 5-9 outside 2.775")
    assert f"preset: overshoot_pct: {f.disagreement[0]}" in v.to_json()["disagreement"]
    assert any(line.startswith("DISAGREEMENT preset: overshoot_pct") for line in contract.table(v))
    flipped = {**OVERSHOOT, "preset": [2.0, 2.8, 3.7, 1.7, 2.9, 2.0, 30.0, 3.0, 30.0, 4.0]}
    g = validate(s, contract.run(toy(flipped), range(10), tmp_path / "f")).get("preset", "overshoot_pct")
    assert "target met on seeds 1-4, missed on 5-9" in g.disagreement
    same = {**OVERSHOOT, "preset": [2.0, 2.8, 3.7, 1.7, 2.9, 2.0, 3.6, 3.0, 2.5, 1.9]}
    steady = validate(s, contract.run(toy(same), range(10), tmp_path / "s"))
    assert steady.get("preset", "overshoot_pct").disagreement == [] and steady.disagreements == []


def test_quick_runs_only_the_quick_arms_and_the_command_line_writes_the_aggregate_and_its_plot(tmp_path: Path) -> None:
    calls: list[tuple[int, str]] = []
    v = contract.main(toy(calls=calls), ["--quick", "--seeds", "0", "1", "--results", str(tmp_path)])
    assert calls == [(0, "preset"), (1, "preset")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["toy-aggregate.json", "toy-aggregate.png", "toy-seed0.json",
                                                        "toy-seed1.json"]
    assert (tmp_path / "toy-aggregate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stored = json.loads((tmp_path / "toy-aggregate.json").read_text())
    assert stored["judged_on"] == list(range(1, 10)) and [a["seed"] for a in stored["arms"]] == [0, 1]
    assert v.get("preset", "overshoot_pct").per_seed == {1: 3.0}


def test_aggregate_reads_the_per_seed_files_of_its_tag_and_runs_nothing(tmp_path: Path) -> None:
    calls: list[tuple[int, str]] = []
    contract.run(toy(), range(10), tmp_path, tag="-x")
    v = contract.main(toy(calls=calls), ["--aggregate", "--tag=-x", "--results", str(tmp_path)])
    assert calls == [] and v.get("preset", "overshoot_pct").seeds_met == 8
    assert (tmp_path / "toy-aggregate-x.json").exists() and (tmp_path / "toy-aggregate-x.png").exists()


def test_the_one_loader_reads_older_per_seed_files_and_aggregates_later_files_replacing_earlier(tmp_path: Path) -> None:
    old_seed = {"scenario": "toy", "lr": 1e-5, "arms": [
        {"arm": "preset", "kind": "pid", "seed": 1, "overshoot_pct": 50.0, "trace": [{"step": 0, "kl": 0.0}]}]}
    old_aggregate = {"aggregate": True, "rows": {}, "arms": [
        {"arm": "preset", "kind": "pid", "seed": 1, "overshoot_pct": 5.0},
        {"arm": "preset", "kind": "pid", "seed": 2, "overshoot_pct": 6.0}]}
    (tmp_path / "a.json").write_text(json.dumps(old_seed))
    (tmp_path / "b.json").write_text(json.dumps(old_aggregate))
    runs = load_results(toy(), [tmp_path / "a.json", tmp_path / "b.json"])
    assert {(r.seed, r.metrics["overshoot_pct"], r.source) for r in runs} == {(1, 5.0, "b.json"), (2, 6.0, "b.json")}
    runs = load_results(toy(), [tmp_path / "b.json", tmp_path / "a.json"],
                        normalize=lambda part, r: {**r, "arm": r["arm"] + (" (old)" if "lr" in part else "")})
    assert {(r.arm, r.seed) for r in runs} == {("preset", 1), ("preset", 2), ("preset (old)", 1)}


def test_tagged_files_take_prefix_and_suffix_tags_and_leave_aggregates_out(tmp_path: Path) -> None:
    for name in ("s-ramp-s5.json", "s-ramp-s6.json", "s-seed5-co.json", "s.json", "s-aggregate-ramp.json"):
        (tmp_path / name).write_text("{}")
    got = contract.tagged_files(tmp_path, "s", ["ramp", "-co", "-"])
    assert [p.name for p in got] == ["s-ramp-s5.json", "s-ramp-s6.json", "s-seed5-co.json", "s.json"]


def test_a_relative_target_is_judged_only_on_the_seeds_its_reference_ran(tmp_path: Path) -> None:
    s = toy()
    runs = [r for r in contract.run(s, range(10), tmp_path) if (r.arm, r.seed) != ("fixed a", 7)]
    f = validate(s, runs).get("preset", "vs_pick")
    assert (f.seeds_judged, f.seeds_met, f.seeds_needed, f.provisional) == (8, 7, 8, True)
    assert contract.verdict_text(f) == "missed (7 of 8, provisional)"


def test_a_target_can_scale_by_another_metric_of_the_reference_arm(tmp_path: Path) -> None:
    # rewind's claim: an arm's final reading at most the open loop's *best* reading (not its final one)
    final = {"open": [9.0] * 10, "rewind": [2.0, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 3.5]}
    best = {"open": [3.0] * 10, "rewind": [2.0] * 10}

    def runner(seed: int, arm: Arm) -> ArmResult:
        return ArmResult(arm.name, arm.kind, seed, {"final": final[arm.name][seed], "best": best[arm.name][seed]})

    s = Declared(name="rw", task="t", arm_list=[Arm("open", "open"), Arm("rewind", "rewind")],
                 metrics=[Metric("final", "min", target=1.0, relative_to="open", ref_metric="best", judge=("rewind",)),
                          Metric("final_vs_final", "min", target=1.0, relative_to="open", judge=("rewind",),
                                 read=lambda r: r["final"]),
                          Metric("best", "min")], runner=runner)
    v = validate(s, contract.run(s, range(10), tmp_path))
    by_best, by_final = v.get("rewind", "final"), v.get("rewind", "final_vs_final")
    assert (by_best.seeds_met, by_best.met) == (8, True)  # 2.5 <= 3 on seeds 1-8, 3.5 > 3 on seed 9
    assert by_best.relative_to == "open's best"  # what the table says the target is against
    assert (by_final.seeds_met, by_final.met) == (9, True)  # against the open loop's final 9.0 every seed holds


def test_a_runs_marks_and_spans_are_drawn_and_older_rewind_records_get_them() -> None:
    """Rewinds (marks) and the fault (a span) on the trace plot; a rewind run stored before records
    carried them has both derived from its rollbacks and fault steps by the scenario's normalize."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.control import contract, rewind

    old = {"arm": rewind.REWIND, "kind": "rewind", "seed": 0, "fault": "data", "fault_steps": [16, 17, 18],
           "rollbacks": [{"at_step": 21, "to_step": 18}], "trace": [{"step": 20, "perplexity": 2.9}]}
    rec = rewind.SPEC.normalize({}, dict(old))
    assert rec["marks"] == [{"step": 21, "label": "rewind 21→18"}]
    assert rec["spans"] == [{"from": 15, "to": 18, "label": "data fault"}]
    clean = rewind.SPEC.normalize({}, {**old, "kind": "clean", "rollbacks": []})
    assert clean["marks"] == [] and "spans" not in clean
    fig, ax = plt.subplots()
    try:
        contract._marks(ax, contract.ArmResult(rec["arm"], "rewind", 0, {}, rec["trace"], rec), "red")
        contract._marks(ax, contract.ArmResult(rec["arm"], "rewind", 1, {}, rec["trace"], rec), "red")
        assert [tuple(line.get_xdata()) for line in ax.lines] == [(21.0, 21.0)] * 2
        assert len(ax.patches) == 1  # the same stretch shaded once
        assert [t.get_text() for t in ax.texts] == ["rewind 21→18"] * 2
    finally:
        plt.close(fig)
