"""gains auto on the training side, without a trainer: the step test's size and place (the
scheduler's warm-up, else 10% of the run, the policy's identify fields first), what the agent
declares at registration, and what it says when a service does not take the declaration: the
registration at the start cancels a test not yet run; a late one (the sender's, after an unreachable
start) keeps the test every rank was given at the start, and says so."""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

import pytest

from actuator.agents.identification import schedule_steps, warmup_test
from actuator.agents.session import Connection, ControlSession
from actuator.policy import load_policy
from actuator.schemas import KnobSpec, RunCreated

AUTO = {"name": "auto-session", "controllers": [{"name": "hold", "probe": "custom.plant", "knob": "learning_rate",
                                                 "setpoint": 1.6, "gains": "auto", "kp": 0.5, "ki": 0.1}]}
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


@contextmanager
def older_service(upstream: str, *, unreachable_first: int) -> Iterator[str]:
    """The real service at ``upstream`` as one that predates gains auto: a registration's
    ``identification`` is dropped on the way in and out. Its first ``unreachable_first``
    registrations answer 503 (the service is not up yet). Yields its URL."""
    refused = [0]

    class Proxy(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            registering = self.command == "POST" and self.path == "/v1/runs"
            if registering and refused[0] < unreachable_first:
                refused[0] += 1
                self.send_response(503)
                self.end_headers()
                return
            if registering:
                body = json.dumps({k: v for k, v in json.loads(body).items() if k != "identification"}).encode()
            headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
            answer = httpx.request(self.command, upstream + self.path, content=body or None, headers=headers)
            content = answer.content
            if registering and answer.status_code == 201:
                content = json.dumps({k: v for k, v in answer.json().items() if k != "identification"}).encode()
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = _forward

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def begun(url: str) -> tuple[ControlSession, Knob]:
    knob = Knob()
    s = ControlSession(load_policy(AUTO), setters=[knob], connection=Connection(url, register_timeout=5))
    s.begin()  # no schedule and no max_steps: the default 20-step test (hold 5, then x e**0.5 for 15)
    return s, knob


def test_the_registration_at_start_cancels_a_test_nobody_fits(sqlite_service, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="actuator")
    with older_service(sqlite_service.url, unreachable_first=0) as url:
        s, knob = begun(url)
        try:
            assert s.run_id is not None and not s.auto_accepted and s.identification is None
            s.step(0, readings={"custom.plant": 1.0})
            assert knob.value == 1e-3
        finally:
            s.finish()
    assert any("the step test is not run" in r.getMessage() for r in caplog.records)


def test_a_late_registration_keeps_the_test_every_rank_was_given(sqlite_service, caplog) -> None:
    """Unreachable at the start: the test planned there is what every rank runs (shared from rank 0
    at the start). The sender registers later, from its thread, before the test's first step: a
    service that does not take the test must not cancel it on rank 0 alone (rank 0 would keep its
    nominal learning rate while the other ranks step theirs)."""
    caplog.set_level(logging.WARNING, logger="actuator")
    with older_service(sqlite_service.url, unreachable_first=1) as url:
        s, knob = begun(url)
        try:
            assert s.unreachable is not None and s.run_id is None
            assert s.identification is not None and not s.identification.started
            s.submit(0, {"custom.plant": 1.0})  # the sender registers now, in its thread
            assert s.sender is not None and s.sender.flush(20) and s.run_id is not None
            assert not s.auto_accepted
            assert s.identification is not None, "the late registration cancelled the shared step test"
            values = []
            for step in range(20):
                s.step(step, readings={"custom.plant": 1.0})
                values.append(knob.value)
        finally:
            s.finish()
    moved = 1e-3 * math.exp(s.identification.test.size)  # -0.5: the knob's default bounds leave no room up
    assert values == [1e-3] * 5 + [pytest.approx(moved, rel=1e-12)] * 15
    late = [r.getMessage() for r in caplog.records if "gains auto is OFF" in r.getMessage()]
    assert late and "still runs (every rank runs the same plan), unfitted" in late[-1]


def stored_window(url: str, s: ControlSession) -> tuple[int, int]:
    """The identification window the service stored for the session's run."""
    auto = httpx.get(f"{url}/v1/runs/{s.run_id}").json()["controllers"]["hold"]["auto"]
    return auto["start"], auto["end"]


def test_an_own_loop_that_says_its_length_gets_a_test_sized_to_a_tenth_of_it(sqlite_service) -> None:
    """``begin(max_steps=400)``, no schedule: the step test is the first 10% of the run (40 steps:
    10 held, 30 moved), not the 20 steps of a run whose length nobody knows."""
    knob = Knob()
    s = ControlSession(load_policy(AUTO), setters=[knob], connection=sqlite_service.url)
    s.begin(max_steps=400)
    values = []
    try:
        assert s.run_id is not None and s.auto_accepted
        assert stored_window(sqlite_service.url, s) == (0, 40)
        for step in range(40):
            s.step(step, readings={"custom.plant": 1.0})
            values.append(knob.value)
    finally:
        s.finish()
    assert s.identification is not None
    moved = 1e-3 * math.exp(s.identification.test.size)
    assert values == [1e-3] * 10 + [pytest.approx(moved, rel=1e-12)] * 30


def test_an_own_loop_with_a_warmup_schedule_fits_the_test_to_the_warmup(sqlite_service) -> None:
    """The learning-rate setter's schedule was built with 16 warm-up steps: the step test fits
    them, whether or not ``begin`` is told the run's length."""
    import torch
    from transformers import get_scheduler

    from actuator.agents.knobs import LearningRateKnob

    for max_steps in (400, 0):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        sched = get_scheduler("linear", opt, num_warmup_steps=16, num_training_steps=400)
        s = ControlSession(load_policy(AUTO), setters=[LearningRateKnob(opt, sched)],
                           connection=sqlite_service.url)
        s.begin(max_steps=max_steps)
        try:
            assert stored_window(sqlite_service.url, s) == (0, 16), f"max_steps={max_steps}"
        finally:
            s.finish()
