"""gains auto on the training side, without a trainer: the step test's size and place (the
scheduler's warm-up, else 10% of the run, the policy's identify fields first), what the agent
declares at registration, and what it says when a service does not take the declaration."""

from __future__ import annotations

import logging
import math
from functools import partial


from actuator.agents.identification import schedule_steps, warmup_test
from actuator.agents.session import ControlSession
from actuator.policy import load_policy
from actuator.schemas import KnobSpec, RunCreated

AUTO = {"name": "auto-session", "controllers": [{"name": "hold", "probe": "custom.plant", "knob": "learning_rate",
                                                 "setpoint": 1.2, "gains": "auto", "kp": 0.5, "ki": 0.1}]}
LR = KnobSpec(name="learning_rate", value=1e-3, min=1e-5, max=1e-1, scale="log")


class Knob:
    name = "learning_rate"

    def __init__(self) -> None:
        self.value = 1e-3

    def read(self) -> float:
        return self.value

    def apply(self, value: float) -> None:
        self.value = value


def spec(**identify):
    doc = dict(AUTO, controllers=[dict(AUTO["controllers"][0], **({"identify": identify} if identify else {}))])
    return load_policy(doc).controllers[0]


def test_the_step_test_fits_the_warmup_else_a_tenth_of_the_run() -> None:
    t = warmup_test(spec(), LR, max_steps=1000, warmup=40)
    assert (t.hold, t.length, t.size) == (10, 30, 0.5) and t.end == 40
    t = warmup_test(spec(), LR, max_steps=1000)
    assert t.end == 100 and t.hold == 25
    t = warmup_test(spec(size=-0.2, length=7), LR, max_steps=1000)
    assert (t.hold, t.length, t.size) == (25, 7, -0.2)
    # a knob at its upper bound is stepped down
    assert warmup_test(spec(), LR.model_copy(update={"value": 0.09}), max_steps=100).size == -0.5


def test_the_schedule_says_its_length_and_warmup() -> None:
    import torch
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    assert schedule_steps(get_scheduler("linear", opt, num_warmup_steps=7, num_training_steps=90)) == (90, 7)
    assert schedule_steps(get_scheduler("constant", opt)) == (0, 0)
    assert schedule_steps(None) == (0, 0)
    assert schedule_steps(torch.optim.lr_scheduler.LambdaLR(opt, partial(math.pow, 1.0))) == (0, 0)


def session() -> ControlSession:
    s = ControlSession(load_policy(AUTO), setters=[Knob()], connection="http://127.0.0.1:9")
    s.bind_knobs(s.extra_setters)
    s.start_identification(5, max_steps=200)
    return s


def created(**extra) -> RunCreated:
    return RunCreated.model_validate({
        "id": "r", "name": "run", "state": "running", "policy_name": "auto-session", "policy_version": 1,
        "knobs": {"learning_rate": LR.model_dump()}, "last_step": None, "last_seq": None,
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", "token": "t", "policy": AUTO,
        **extra})


def test_the_window_is_declared_at_registration() -> None:
    s = session()
    assert s.identification is not None and s.identification.knob == "learning_rate"
    window = s.auto_window
    assert window is not None and (window.controller, window.start, window.end) == ("hold", 5, 25)
    assert s.identification.holds("learning_rate", 24) and not s.identification.holds("learning_rate", 25)
    s._check_auto_accepted(created(identification=[window.model_dump()]))
    assert s.auto_accepted and s.identification is not None


def test_a_service_that_ignores_the_window_is_said_loudly(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="actuator")
    s = session()
    s._check_auto_accepted(created())  # an answer without the field: a service that predates gains auto
    assert not s.auto_accepted
    assert s.identification is None, "no step test nobody fits"
    warned = [r for r in caplog.records if "gains auto is OFF" in r.getMessage()]
    assert warned and warned[0].levelno == logging.WARNING and "fallback gains" in warned[0].getMessage()


def test_a_run_resumed_from_a_checkpoint_runs_no_second_step_test(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="actuator")
    s = session()
    s.restore({"run_id": "r", "seq": 3}, token="t")
    assert s.identification is None and s.auto_window is None
    assert any("continues from a checkpoint" in r.getMessage() for r in caplog.records)
