"""Issue 36: the README's quick path, walked as a new user walks it. `actuator serve` in its own
process (SQLite in a temporary folder), a tiny real `Trainer.train()` with `ActuatorCallback`
pointed at it by `$ACTUATOR_URL`, the run id and console URL read from the WARNING line the agent
prints (stock scripts show warnings only), the console page opened, and `actuator decisions
<id prefix> --explain` run as a command."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.probes import KLDrift
from actuator.testing import make_service

sys.path.insert(0, str(Path(__file__).parent.parent / "agents"))
from agent_helpers import HELD_OUT, make_char_tokenizer, make_trainer  # noqa: E402

POLICY = {"name": "quick-path", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                                 "setpoint": 0.0, "kp": 5.0, "ki": 1.0,
                                                 "filter": {"kind": "ema", "alpha": 0.5}}]}
REGISTERED = re.compile(r"actuator: run (?P<id>[0-9a-f-]{36}) registered \(policy (?P<policy>\S+) v(?P<version>\d+)\); "
                        r"console: (?P<console>\S+/ui/runs/(?P=id))$")


def test_the_quick_path_from_serve_to_explained_decisions(tmp_path, monkeypatch, caplog):
    svc = make_service(f"sqlite:///{tmp_path / 'actuator.db'}", log_dir=str(tmp_path), serve_args=[]).start()
    try:
        monkeypatch.setenv("ACTUATOR_URL", svc.url)
        tokenizer = make_char_tokenizer()
        trainer = make_trainer(tmp_path, tokenizer, steps=30, scheduler="constant", lr=5e-3)
        trainer.add_callback(ActuatorCallback(
            POLICY, knobs={"learning_rate": {"min": 1e-9, "max": 1e-2, "max_step": 0.5}},
            probes=[KLDrift(HELD_OUT, tokenizer, every=2, max_length=32)], reporting=Reporting(budget_share=1.0)))
        with caplog.at_level(logging.WARNING):
            trainer.train()

        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        found = [m for m in map(REGISTERED.match, lines) if m]
        assert len(found) == 1, lines
        run_id, console = found[0]["id"], found[0]["console"]
        assert found[0]["policy"] == "quick-path" and console == f"{svc.url}/ui/runs/{run_id}"

        page = httpx.get(console, timeout=10)
        assert page.status_code == 200 and run_id in page.text

        decisions = httpx.get(f"{svc.url}/v1/runs/{run_id}/decisions", timeout=10).json()
        assert decisions["total"] >= 1, "the controller decided nothing: nothing to explain"
        actuator = shutil.which("actuator", path=os.path.dirname(sys.executable)) or "actuator"
        out = subprocess.run([actuator, "decisions", run_id[:8], "--explain"], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "COLUMNS": "200"})
        assert out.returncode == 0, out.stderr
        for d in decisions["items"]:
            assert f"decision {d['number']} · step {d['step']} · learning_rate" in out.stdout
            assert d["reason"] in out.stdout
        assert out.stdout.count("levels after this decision: P") == decisions["total"]
        assert "applied after step" in out.stdout  # the agent's word on what it did
        assert out.stdout.rstrip().endswith(f"{decisions['total']} decisions")
    finally:
        svc.stop()
