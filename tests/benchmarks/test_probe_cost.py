"""benchmarks/probes/cost.py without a model: bad input is refused naming the flag, before anything loads."""

from __future__ import annotations

import pytest

from benchmarks.probes import cost


def test_repeats_below_1_is_refused_naming_the_flag_before_the_model_loads(capsys, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("actuator.agents.models.load_smollm2", no_model)
    with pytest.raises(SystemExit):
        cost.main(["--repeats", "0"])
    assert "--repeats must be >= 1, got 0" in capsys.readouterr().err


def test_the_median_skips_the_warm_up_call(monkeypatch):
    calls = []
    times = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0])  # three timed calls: 1 s, 3 s, 2 s
    monkeypatch.setattr(cost.time, "perf_counter", lambda: next(times))
    assert cost._median_seconds(lambda: calls.append(1), 3) == 2.0
    assert len(calls) == 4  # 1 warm-up + 3 timed
