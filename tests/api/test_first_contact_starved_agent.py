"""Issue 36: a probe the probe-time budget cannot fit, end to end. A real tiny `Trainer.train()`
under `ActuatorCallback`, one probe far slower than the training steps: the agent warns once with
the arithmetic, and the run's state (`GET /v1/runs/{id}`, `GET /v1/runs`) and `actuator runs`
name the starved probe."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.probes import KLDrift, Probe
from actuator.cli import app

sys.path.insert(0, str(Path(__file__).parent.parent / "agents"))
from agent_helpers import HELD_OUT, make_char_tokenizer, make_trainer  # noqa: E402

POLICY = {"name": "starving", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                               "setpoint": 0.0, "kp": 1.0, "ki": 0.2}],
          "guardrails": [{"name": "slow-cap", "probe": "custom.slow", "bound": "upper", "threshold": 1.0,
                          "action": "alert"}]}


class Slow(Probe):
    """A probe that takes far longer than a training step (as PolicyKL does on a real model)."""

    name = "slow"

    def __init__(self, seconds: float) -> None:
        self._init_schedule(1, False)
        self.seconds = seconds

    def _measure(self, model, *, max_examples=None):  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)
        return {"custom.slow": 0.0}


def test_a_starved_probe_is_warned_and_shown_in_the_run_state(sqlite_service, tmp_path, caplog):
    url = sqlite_service.url
    tokenizer = make_char_tokenizer()
    trainer = make_trainer(tmp_path, tokenizer, steps=12, scheduler="constant")
    cb = ActuatorCallback(POLICY, connection=url, knobs={"learning_rate": {"min": 1e-9, "max": 1e-2}},
                          probes=[KLDrift(HELD_OUT, tokenizer, every=1, max_length=16), Slow(0.5)],
                          reporting=Reporting(budget_share=0.2)).attach(trainer)
    with caplog.at_level(logging.WARNING):
        trainer.train()

    warned = [r.getMessage() for r in caplog.records if "probe slow skipped for budget" in r.getMessage()]
    assert len(warned) == 1, warned  # once per starvation, with its cost and the budget
    assert "20% of wall time" in warned[0]
    # The service says what the agent's suite says (the budget may starve kl_drift too, beside it).
    starved = sorted(cb.session.suite.starved)
    assert "slow" in starved
    state = httpx.get(f"{url}/v1/runs/{cb.session.run_id}", timeout=10).json()
    assert state["starved"] == starved
    assert next(r for r in httpx.get(f"{url}/v1/runs", timeout=10).json() if r["id"] == cb.session.run_id)["starved"] == starved
    out = CliRunner().invoke(app, ["runs", "--url", url], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    assert any(line.startswith("*") and cb.session.run_id in line and line.endswith(": " + ", ".join(starved))
               for line in out.output.splitlines()), out.output
