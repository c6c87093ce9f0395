"""ControlSession: a loop of one's own under control, with the callback's guarding and
acknowledgements, against the real service."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from actuator import ConfigError

ROOT = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:9"  # never contacted


def _decisions(url: str, run_id: str) -> list[dict]:
    return httpx.get(f"{url}/v1/runs/{run_id}/decisions", params={"limit": 1000}).json()["items"]


def test_the_own_loop_example_acknowledges_its_decisions_within_the_knobs_limits(sqlite_service):
    url = sqlite_service.url
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "own_loop.py"), "--url", url, "--steps", "14",
                          "--probe-every", "2", "--budget-share", "1.0"],  # every due reading runs, however fast the steps
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    [run] = httpx.get(f"{url}/v1/runs").json()
    assert run["state"] == "finished"
    spec = run["knobs"]["learning_rate"]
    decisions = _decisions(url, run["id"])
    # The loop receives a decision at the step boundary after the observation it answers: every
    # decision but those answering the last observation reached a boundary.
    received = [d for d in decisions if d["step"] <= 14]
    assert received, out.stdout
    for d in received:
        assert d["applied_step"] is not None, (d, out.stdout)
        assert d["skipped"] is None
        assert spec["min"] <= d["applied_value"] <= spec["max"], (d, spec)
        assert d["applied_value"] == pytest.approx(d["new_value"], rel=1e-9)
    assert f"{len(received)} decisions applied" in out.stdout


# A loop with no transformers installed (imports of it fail), no torch model: a plain setter and
# probe readings the loop measures itself.
NO_TRANSFORMERS = textwrap.dedent(
    """
    import json, sys
    sys.modules["transformers"] = None  # import transformers -> ImportError
    from actuator.agents.session import Connection, ControlSession, RunInfo

    class Dial:
        name = "learning_rate"
        def __init__(self):
            self.value = 1e-3
        def read(self):
            return self.value
        def apply(self, value):
            self.value = float(value)
            return self.value

    policy = {{"name": "own", "controllers": [{{"name": "down", "probe": "custom.rising", "knob": "learning_rate",
              "setpoint": 0.0, "kp": 1.0}}]}}
    dial = Dial()
    session = ControlSession(policy, setters=[dial], connection=Connection({url!r}), run=RunInfo("plain"),
                             knobs={{"learning_rate": {{"min": 1e-5, "max": 1e-3, "max_step": 0.3}}}})
    session.begin()
    for step in range(1, 25):
        session.step(step, readings={{"custom.rising": float(step)}}, metrics={{"loss": 1.0 / step}})
        session.sender.flush(5.0)
    session.finish()
    print(json.dumps({{"run_id": session.run_id, "applied": session.applied, "dial": dial.value,
                      "transformers": "transformers" in sys.modules and sys.modules["transformers"] is not None,
                      "seq": session.seq}}))
    """
)


def test_a_loop_without_transformers_gets_decisions_guarded_applied_and_acknowledged(sqlite_service):
    url = sqlite_service.url
    out = subprocess.run([sys.executable, "-c", NO_TRANSFORMERS.format(url=url)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert not result["transformers"]
    assert result["seq"] == 24
    assert result["applied"], out.stderr
    decisions = {d["number"]: d for d in _decisions(url, result["run_id"])}
    for entry in result["applied"]:
        stored = decisions[entry["number"]]
        assert stored["applied_step"] == entry["step"] and stored["applied_value"] == pytest.approx(entry["applied"])
        assert 1e-5 <= entry["applied"] <= 1e-3
    assert result["dial"] == pytest.approx(result["applied"][-1]["applied"])
    assert httpx.get(f"{url}/v1/runs/{result['run_id']}").json()["state"] == "finished"


def test_the_session_guards_a_decision_past_the_knobs_bounds_and_rate_limit(sqlite_service):
    """The guard on the agent side: a decision ordering more than the run's bounds and rate limit
    allow (a service of another version, an operator's value) is clamped before it is applied."""
    from actuator.agents.session import ControlSession
    from actuator.client import ActuatorClient

    class Dial:
        name = "kl_beta"

        def __init__(self) -> None:
            self.value = 0.1

        def read(self) -> float:
            return self.value

        def apply(self, value: float) -> float:
            self.value = float(value)
            return self.value

    policy = {"name": "guard", "controllers": [{"name": "down", "probe": "custom.rising", "knob": "kl_beta",
                                                "setpoint": 0.0, "kp": 1.0}]}
    dial = Dial()
    session = ControlSession(policy, setters=[dial], connection=sqlite_service.url,
                             knobs={"kl_beta": {"min": 0.01, "max": 0.5, "max_step": 0.2}})
    session.begin()
    for step in range(1, 6):
        session.step(step, readings={"custom.rising": float(step)})
        session.sender.flush(5.0)
    session.finish()
    with ActuatorClient(sqlite_service.url) as client:
        decision = client.list_decisions(session.run_id, limit=10).items[0]
    # A session of its own, without a sender: the same decision, ordering 100x.
    other = ControlSession(policy, setters=[Dial()], connection=sqlite_service.url,
                           knobs={"kl_beta": {"min": 0.01, "max": 0.5, "max_step": 0.2}})
    other.bind_knobs({})
    other.apply([decision.model_copy(update={"new_value": 10.0})], step=7)
    [entry] = other.applied
    assert entry["ordered"] == 10.0
    assert entry["applied"] == pytest.approx(0.1 * 2.718281828459045 ** 0.2)  # one max_step up, in log scale


def test_a_knob_without_a_setter_is_a_config_error():
    from actuator.agents.session import ControlSession

    session = ControlSession("stored-policy", connection="http://127.0.0.1:9",
                             knobs={"learning_rate": {}})
    with pytest.raises(ConfigError, match="knobs.learning_rate: no setter"):
        session.bind_knobs({})


def test_the_old_arguments_are_refused_naming_the_argument():
    """The keywords before the groups (``url=``, ``run_name=``, ``budget_share=``, ...) are gone: a
    TypeError names the one given; the groups carry the same settings into the checkpoint's args."""
    from actuator.agents.callback import ActuatorCallback, Connection, Reporting, RunInfo

    for old in ({"url": URL}, {"timeout": 3.0}, {"run_name": "r"}, {"budget_share": 0.5}, {"on_breach": "halt"}):
        with pytest.raises(TypeError, match=next(iter(old))):
            ActuatorCallback("preset:sft-capability", **old)
    new = ActuatorCallback("preset:sft-capability", connection=Connection(URL, timeout=3.0),
                           run=RunInfo("r"), reporting=Reporting(budget_share=0.5, report_every=2))
    args = new.state()["args"]
    assert args["connection"]["url"] == URL and args["connection"]["timeout"] == 3.0
    assert args["run"]["name"] == "r" and args["reporting"] == {"budget_share": 0.5, "report_every": 2}
    assert new.session.connection == Connection(URL, timeout=3.0).resolved()


def test_a_step_that_repeats_the_baselines_is_said_once(sqlite_service, caplog):
    """Issue 57: the own-loop outline's ``range(steps)`` reported the first training step as step 0,
    on top of the baseline's reading at step 0, without a word. The session says so (once) and
    still takes the step; a loop counting from 1 hears nothing."""
    import logging

    from actuator.agents.session import Connection, ControlSession

    class Dial:
        name = "learning_rate"
        value = 1e-3

        def read(self):
            return self.value

        def apply(self, value):
            self.value = float(value)
            return self.value

    def run(first: int) -> tuple[ControlSession, str]:
        caplog.clear()
        session = ControlSession({"name": "steps", "controllers": [{"name": "c", "probe": "custom.x",
                                                                   "knob": "learning_rate", "setpoint": 0.0,
                                                                   "kp": 1.0}]},
                                 setters=[Dial()], connection=Connection(sqlite_service.url))
        with caplog.at_level(logging.WARNING, logger="actuator.agents"):
            session.begin()
            for step in range(first, first + 3):
                session.step(step, readings={"custom.x": 1.0})
            session.finish()
        return session, caplog.text

    session, text = run(0)
    assert session.baseline_step == 0 and [h["step"] for h in session.history] == [0, 1, 2]  # taken all the same
    assert text.count("does not come after") == 1, text
    assert ("step(0) does not come after the baseline's, read by begin() at step 0: its readings and decisions "
            "land on a step already reported. Number the training steps from the baseline's step + 1") in text
    _, text = run(1)
    assert "does not come after" not in text, text
