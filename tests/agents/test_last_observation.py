"""A run's last step reaches the service (issue 57): probes every 3 steps of a 7-step run read at
steps 0, 3 and 6; at train() end the agent sends step 7 (metrics and knobs), so the run list, its
REST answer and the console say step 7, not 6. Real Trainer.train() and the real service."""

from __future__ import annotations

import re

import httpx

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.probes import KLDrift
from agent_helpers import HELD_OUT, make_trainer

POLICY = {"name": "last-step", "controllers": [{"name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate",
                                                 "setpoint": 0.5, "kp": 1.0, "ki": 0.1, "direction": "direct"}]}


def test_the_last_step_is_reported_at_train_end(tmp_path, char_tokenizer, sqlite_service) -> None:
    cb = ActuatorCallback(POLICY, connection=sqlite_service.url, reporting=Reporting(budget_share=1.0),
                          knobs={"learning_rate": {"min": 1e-6, "max": 1e-2}},
                          probes=[KLDrift(HELD_OUT, char_tokenizer, every=3, max_length=32)])
    trainer = make_trainer(tmp_path, char_tokenizer, steps=7, scheduler="constant", callbacks=[cb])
    trainer.train()
    assert [h["step"] for h in cb.session.history if h["probes"]] == [0, 3, 6]
    url = sqlite_service.url
    run = next(r for r in httpx.get(f"{url}/v1/runs").json() if r["id"] == cb.session.run_id)
    assert run["last_step"] == 7 and run["state"] == "finished"
    row = re.search(rf'<tr data-run="{cb.session.run_id}".*?</tr>', httpx.get(f"{url}/ui").text, re.S)
    assert row is not None
    assert re.findall(r'<td class="num"[^>]*>([^<]*)</td>', row.group(0))[0] == "7", row.group(0)  # the step column
    # the closing observation carries the knobs in effect and no probe reading
    last = httpx.get(f"{url}/v1/runs/{cb.session.run_id}").json()
    assert last["knobs_in_effect"]["learning_rate"] == cb.session.setters["learning_rate"].read()
