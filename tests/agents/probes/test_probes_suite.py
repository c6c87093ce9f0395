"""ProbeSuite and the safety wrapper: schedules, budget, reports, restored state."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from actuator.agents.probes import Probe, ProbeReport, ProbeSuite, probe_mode


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class CostlyProbe(Probe):
    """Advances a fake clock by ``seconds_per_example`` for each example it measures."""

    def __init__(self, name, clock, *, examples=8, seconds_per_example=1.0, every=1, on_evaluate=False):
        self.name = name
        self._init_schedule(every, on_evaluate)
        self.clock, self.examples, self.cost = clock, examples, seconds_per_example
        self.calls: list[int | None] = []

    @property
    def num_examples(self):
        return self.examples

    def _measure(self, model, *, max_examples):
        used = len(self._selection(self.examples, max_examples))
        self.calls.append(max_examples)
        self.clock.now += used * self.cost
        return {f"{self.name}.value": float(used)}


class RNGProbe(Probe):
    name = "rng"
    every = 1

    def _measure(self, model, *, max_examples):
        random.random(), np.random.rand(), torch.rand(3)  # all three generators move
        assert not model.training and not torch.is_grad_enabled()
        return {"rng": 1.0}


class FailingProbe(Probe):
    name = "broken"
    every = 1

    def _measure(self, model, *, max_examples):
        raise RuntimeError("boom")


def _model():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5), torch.nn.Linear(2, 2))
    model.train()
    model[1].eval()  # a submodule deliberately kept in eval mode must stay so
    return model


def test_probe_mode_restores_modes_rng_and_grad():
    model = _model()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), np.random.rand(), torch.rand(1))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with probe_mode(model):
        assert not any(m.training for m in model.modules()) and not torch.is_grad_enabled()
        random.random(), np.random.rand(), torch.rand(5)
    assert torch.is_grad_enabled()
    assert [m.training for m in model.modules()] == [True, True, False, True]
    assert (random.random(), np.random.rand(), float(torch.rand(1))) == (expected[0], expected[1], float(expected[2]))


def test_probe_mode_restores_after_an_error():
    model = _model()
    state = torch.get_rng_state()
    with pytest.raises(RuntimeError):
        with probe_mode(model):
            torch.rand(10)
            raise RuntimeError
    assert model.training and torch.equal(torch.get_rng_state(), state)


def test_measure_is_safe_on_its_own():
    model = _model()
    torch.manual_seed(3)
    state = torch.get_rng_state()
    assert RNGProbe().measure(model) == {"rng": 1.0}
    assert torch.equal(torch.get_rng_state(), state) and model[0].training and not model[1].training


def test_schedule_due_and_evaluate():
    clock = FakeClock()
    every5 = CostlyProbe("a", clock, every=5)
    on_eval = CostlyProbe("b", clock, every=None, on_evaluate=True)
    suite = ProbeSuite([every5, on_eval], budget_share=1.0, clock=clock)
    suite.setup(_model())
    assert [s for s in range(1, 16) if every5.due(s)] == [5, 10, 15] and every5.due(0)
    assert suite.run(_model(), 3) is None
    assert set(suite.run(_model(), 5).seconds) == {"a"}
    assert set(suite.run(_model(), 7, evaluate=True).seconds) == {"b"}
    assert set(suite.run(_model(), 7, force=True).seconds) == {"a", "b"}


def test_report_carries_values_and_cost_metrics():
    clock = FakeClock()
    suite = ProbeSuite([CostlyProbe("a", clock, examples=4, seconds_per_example=0.5)], clock=clock)
    suite.setup(_model())
    clock.now = 100.0
    report = suite.run(_model(), 1)
    assert isinstance(report, ProbeReport) and report.step == 1
    assert report.values["a.value"] == 4.0
    assert report.seconds == {"a": 2.0} and report.values["probe_seconds.a"] == 2.0
    assert report.values["probe_share"] == pytest.approx(2.0 / 102.0)
    assert report.examples == {"a": 4} and report.skipped == [] and report.notes == []
    assert suite.probe_share == pytest.approx(2.0 / 102.0)


def test_budget_holds_the_share_by_subsampling_and_skipping():
    clock = FakeClock()
    cheap = CostlyProbe("cheap", clock, examples=8, seconds_per_example=0.05, every=1)
    costly = CostlyProbe("costly", clock, examples=16, seconds_per_example=0.5, every=5)
    suite = ProbeSuite([cheap, costly], budget_share=0.10, clock=clock)
    suite.setup(_model())
    skipped, subsampled, shares = [], [], []
    for step in range(1, 401):
        clock.now += 1.0  # one training step
        report = suite.run(_model(), step)
        if report is None:
            continue
        skipped += report.skipped
        subsampled += [n for n in report.notes if "subsampled" in n]
        shares.append(report.values["probe_share"])
    # Unbudgeted the probes would take 0.4 s/step + 8 s every 5 steps: 2 s per 1 s of training.
    assert suite.probe_share <= 0.10 + 1e-9
    assert max(shares[len(shares) // 2 :]) <= 0.10 + 0.02  # stays near the budget, not just at the end
    assert "costly" in skipped and subsampled
    assert any(0 < n < 16 for n in costly.calls if n is not None)
    assert len(costly.calls) >= 10  # the expensive probe is not starved by the cheap one
    assert all(note.startswith(("cheap", "costly")) for note in subsampled)


def test_first_measurement_is_the_unbudgeted_baseline():
    clock = FakeClock()
    probe = CostlyProbe("a", clock, examples=10, seconds_per_example=1.0)
    suite = ProbeSuite([probe], budget_share=0.01, clock=clock)
    suite.setup(_model())
    report = suite.run(_model(), 0)
    assert report.examples == {"a": 10} and suite.probe_share == 1.0
    report = suite.run(_model(), 1)
    assert report.skipped == ["a"] and "skipped for budget" in report.notes[0]
    assert "probe_seconds.a" not in report.values
    assert suite.run(_model(), 2, force=True).examples == {"a": 10}  # force ignores the budget


def test_failing_probe_is_reported_and_the_others_run():
    clock = FakeClock()
    suite = ProbeSuite([FailingProbe(), CostlyProbe("a", clock)], clock=clock)
    suite.setup(_model())
    model = _model()
    report = suite.run(model, 1)
    assert report.failed == ["broken"] and "boom" in " ".join(report.notes)
    assert report.values["a.value"] == 8.0 and model[0].training
    with pytest.raises(RuntimeError, match="boom"):
        ProbeSuite([FailingProbe()], on_error="raise").run(model, 1)


def test_suite_rejects_bad_configuration():
    clock = FakeClock()
    with pytest.raises(ValueError, match="unique"):
        ProbeSuite([CostlyProbe("a", clock), CostlyProbe("a", clock)])
    with pytest.raises(ValueError, match="budget_share"):
        ProbeSuite([], budget_share=0.0)
    with pytest.raises(ValueError, match="every"):
        CostlyProbe("a", clock, every=0)


def test_state_dict_round_trip():
    clock = FakeClock()
    suite = ProbeSuite([CostlyProbe("a", clock)], clock=clock)
    suite.setup(_model())
    clock.now = 50.0
    suite.run(_model(), 1)
    state = suite.state_dict()
    resumed = ProbeSuite([CostlyProbe("a", clock)], clock=clock)
    resumed.load_state_dict(state)
    assert resumed.probe_share == pytest.approx(suite.probe_share)
    assert resumed.state_dict() == state


def test_a_starved_probe_warns_once_with_its_cost_budget_and_interval(caplog):
    # GRPO's first contact: a 13 s PolicyKL at 3 s per step under a 10% budget is skipped after
    # its baseline. Before, that was a DEBUG line: the run trained uncontrolled without a word.
    clock = FakeClock()
    probe = CostlyProbe("policy_kl", clock, examples=13, seconds_per_example=1.0, every=2)
    suite = ProbeSuite([probe], budget_share=0.10, clock=clock)
    suite.setup(_model())
    suite.run(_model(), 0)  # the unbudgeted baseline: 13 s
    with caplog.at_level("WARNING", logger="actuator.agents"):
        for step in range(1, 11):
            clock.now += 3.0
            suite.run(_model(), step)
    warnings = [r.getMessage() for r in caplog.records if "skipped for budget" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per starvation, not once per skip
    # 13 s x 0.9 / (0.1 x 3 s) = 39 steps between readings.
    # the cost quoted is the one its last (full) reading measured, and says so (issue 57)
    assert "one measurement took 13.00 s (its reading at step 0, 13 examples)" in warnings[0]
    assert "10%" in warnings[0] and "every 39 steps" in warnings[0]
    assert "every=2" in warnings[0] and "step 2" in warnings[0]
    assert set(suite.starved) == {"policy_kl"}
    last = suite.run(_model(), 12)  # due and skipped again: the report says how long it has starved
    assert last.values["probe_starved.policy_kl"] == 6.0  # steps 2, 4, ..., 12
    # A measurement ends the starvation (forced here); the next starvation warns again.
    suite.run(_model(), 12, force=True)
    assert suite.starved == {}
    caplog.clear()
    assert not any(k.startswith("probe_starved.") for k in suite.run(_model(), 13, force=True).values)
    with caplog.at_level("INFO", logger="actuator.agents"):
        clock.now += 3.0
        suite.run(_model(), 14)
    again = [r for r in caplog.records if "skipped for budget" in r.getMessage()]
    # Told again, but at INFO: loud once per probe per run (a probe every step alternating between a
    # reading and a skip would otherwise warn every other step).
    assert len(again) == 1 and again[0].levelname == "INFO"
    assert set(suite.starved) == {"policy_kl"}


def test_a_starvation_after_a_subsampled_reading_says_its_cost_is_an_estimate(caplog):
    """Issue 57: a starvation warning quoted ~9.42 s "a measurement" where the probe's reading had
    taken 0.92 s (on a subset). After a subsampled reading the full cost is an extrapolation: the
    warning says so, beside what the last reading really took and on how many examples."""
    clock = FakeClock()
    probe = CostlyProbe("kl", clock, examples=10, seconds_per_example=1.0, every=1)
    suite = ProbeSuite([probe], budget_share=0.5, clock=clock)
    suite.setup(_model())
    suite.run(_model(), 0, baseline=True)  # 10 s, paid like setup
    clock.now += 4.0
    assert suite.run(_model(), 1).examples == {"kl": 4}  # 4 s of room: 4 of 10 examples
    with caplog.at_level("WARNING", logger="actuator.agents"):
        clock.now += 0.1
        assert suite.run(_model(), 2).skipped == ["kl"]
    [warning] = [r.getMessage() for r in caplog.records if "skipped for budget" in r.getMessage()]
    assert ("one full measurement (10 examples) is estimated at ~10.00 s, extrapolated from its last reading: "
            "4.00 s on 4 examples at step 1") in warning, warning


def test_a_probe_a_guardrail_compares_runs_whole_or_is_skipped_never_subsampled():
    """Same budget, same costs: the probe in ``whole`` gets no subset reading (its values are all
    whole or absent) where the same probe outside it is subsampled."""
    def run(whole):
        clock = FakeClock()
        cheap = CostlyProbe("cheap", clock, examples=8, seconds_per_example=0.05, every=1)
        costly = CostlyProbe("costly", clock, examples=16, seconds_per_example=0.5, every=5)
        suite = ProbeSuite([cheap, costly], budget_share=0.10, clock=clock, whole=whole)
        suite.setup(_model())
        notes = []
        for step in range(1, 401):
            clock.now += 1.0
            report = suite.run(_model(), step)
            if report is not None:
                notes += report.notes
        return costly.calls, notes, suite

    calls, _, _ = run(())
    assert any(n is not None and n < 16 for n in calls)  # the control: subsampled without the rule
    calls, notes, suite = run({"costly"})
    assert calls and all(n is None for n in calls), calls  # every reading whole
    assert len(calls) >= 3 and suite.probe_share <= 0.10 + 1e-9  # still read, within the budget
    assert any(n.startswith("costly skipped for budget (whole or not at all") for n in notes), notes
    assert not any(n.startswith("costly subsampled") for n in notes)
