"""Issue 57, a cheap start: what a run pays before its first step (the probes' set-up with the
drift reference, the baseline readings) is said at train() start, with each probe's own seconds:
the same figures the baseline observation carries to the service."""

from __future__ import annotations

import logging
import re

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.probes import Perplexity
from agent_helpers import HELD_OUT, make_trainer


def test_the_start_up_cost_is_logged_with_each_probes_baseline_seconds(tmp_path, char_tokenizer, sqlite_service,
                                                                        caplog):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=3, scheduler="constant")
    policy = {"name": "start-up-cost", "probes": [{"name": "perplexity", "every": 2}],
              "controllers": [{"name": "ppl", "probe": "perplexity", "knob": "learning_rate",
                               "setpoint": "+500%", "kp": 0.0, "ki": 1.0, "direction": "direct"}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, probes=[Perplexity(HELD_OUT, char_tokenizer, every=2)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    with caplog.at_level(logging.INFO, logger="actuator.agents"):
        trainer.train()
    found = re.search(r"start-up before the first step: ([\d.]+) s \(probe set-up, the drift reference included, "
                      r"([\d.]+) s; baseline readings ([\d.]+) s: perplexity ([\d.]+) s\)", caplog.text)
    assert found, caplog.text
    total, set_up, baseline, perplexity = map(float, found.groups())
    assert abs(total - (set_up + baseline)) <= 0.011 and perplexity <= baseline + 0.005
    # The seconds said are the baseline observation's own, as it was sent to the service.
    first = cb.session.history[0]
    assert first["step"] == 0 and round(first["metrics"]["probe_seconds.perplexity"], 2) == perplexity
