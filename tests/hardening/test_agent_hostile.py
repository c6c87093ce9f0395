"""Issue 34, agent side: control is never lost silently.

A real ``Trainer.train()`` on a tiny model runs under ActuatorCallback against the real service,
reached through a front (a Starlette app under a real uvicorn on loopback) that misbehaves the way
a newer service version, a proxy or a captive portal does: answers with fields the agent does not
know, HTML with status 200, truncated JSON, an answer that says more decisions follow but never
advances, an answer fed one byte at a time, decision numbers past 2^31-1.

What must hold: unknown fields are ignored (every observation delivered, every decision applied
at the value the optimizer then really uses); an answer the agent cannot read is an outage (counted,
warned once, retried: nothing dropped); registration raises only on the service's own refusal;
follow-up requests are bounded; every request has a total deadline and the backlog its limit.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from transformers import TrainerCallback

import actuator.agents.session as session_module  # the session builds the sender and client
from actuator.agents.callback import ActuatorCallback, Connection, Reporting
from actuator.agents.probes import KLDrift
from actuator.agents.sender import FOLLOW_UPS, BackgroundSender
from actuator.schemas import MAX_INT
from agent_helpers import HELD_OUT, SlowSteps, make_trainer, record_lr_used
from harden import ServedApp, StoreView
from actuator.testing import Service

CORPUS = Path(__file__).parent / "corpus" / "answers.yaml"
# Drift above a zero setpoint: the controller lowers the learning rate on nearly every observation.
POLICY = {"name": "hostile-answers", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                                       "setpoint": 0.0, "kp": 0.5, "ki": 0.1}]}
KNOBS = {"learning_rate": {"min": 1e-7, "max": 1e-2, "max_step": 0.2}}


def _cases() -> list[Any]:
    cases = yaml.safe_load(CORPUS.read_text())["cases"]
    names = [c["name"] for c in cases]
    assert len(set(names)) == len(names), "case names must be unique"
    return [pytest.param(c, id=c["name"]) for c in cases]


def sender_with(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> None:
    """The callback builds its sender with the defaults (backoff from 0.5 s up to 30 s); a test of a
    few seconds retries faster."""
    monkeypatch.setattr(session_module, "BackgroundSender",
                        functools.partial(BackgroundSender, initial_backoff=0.05, max_backoff=0.2, **kw))


class Front:
    """What stands between the agent and the real service: it forwards every request, and rewrites
    the answers of one kind (``rule["answer"]``: ``register`` or ``ingest``) as ``rule`` says:
    ``add`` / ``replace`` / ``times`` (see corpus/answers.yaml), ``stuck`` (every answer repeats
    the first decisions seen and says more follow), ``drip`` (seconds between the bytes of an
    answer that never completes; until ``release`` is set) or ``renumber`` (decision numbers
    shifted up by this much; the requests' numbers shifted back)."""

    def __init__(self, upstream: str, rule: dict[str, Any]) -> None:
        self.upstream, self.rule = upstream, rule
        self.count: Counter[str] = Counter()
        self.seqs: set[int] = set()  # observation seqs the front has seen
        self.follow_ups = 0  # ingest requests carrying no observation not seen before
        self.remembered: list[dict[str, Any]] | None = None
        self.release = threading.Event()
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST", "PUT", "DELETE"])])

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        kind = ("ingest" if path.endswith("/observations") else
                "register" if path == "/v1/runs" and request.method == "POST" else "other")
        self.count[kind] += 1
        body = await request.body()
        if kind == "ingest":
            seqs = {o["seq"] for o in json.loads(body)["observations"]}
            self.follow_ups += not (seqs - self.seqs)
            self.seqs |= seqs
        rule = self.rule if kind == self.rule["answer"] else {}
        early = self.count[kind] <= rule.get("times", math.inf)
        if "replace" in rule and early:
            r = rule["replace"]
            if "pad" in r:  # a readable answer, padded to r["pad"] bytes (sent whole, or "chunked")
                return self._padded(r)
            return Response(r["body"], r["status"], media_type=r["type"])
        if "drip" in rule and not self.release.is_set():
            return StreamingResponse(self._drip(rule["drip"]), media_type="application/json")
        if "renumber" in rule:
            body = self._renumber_request(body, rule["renumber"])
        headers = {k: v for k, v in request.headers.items() if k in ("authorization", "content-type")}
        async with httpx.AsyncClient(timeout=30) as client:
            up = await client.request(request.method, self.upstream + path, content=body, headers=headers,
                                      params=list(request.query_params.multi_items()))
        if not rule or up.status_code >= 400:
            return Response(up.content, up.status_code, media_type=up.headers.get("content-type"))
        return JSONResponse(self._rewrite(up.json(), rule), up.status_code)

    @staticmethod
    def _padded(r: dict[str, Any]) -> Response:
        head = b'{"accepted": 0, "duplicates": 0, "decisions": [], "state": "running", "knobs": {}, "pad": "'
        body = head + b"x" * max(0, r["pad"] - len(head) - 2) + b'"}'
        if not r.get("chunked"):
            return Response(body, r["status"], media_type=r["type"])

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: only reading tells the size
            for i in range(0, len(body), 65536):
                yield body[i:i + 65536]

        return StreamingResponse(chunks(), r["status"], media_type=r["type"])

    @staticmethod
    async def _drip(interval: float) -> AsyncIterator[bytes]:
        for _ in range(int(20 / interval)):  # 20 s: far past any deadline; JSON whitespace, never a value
            yield b" "
            await anyio.sleep(interval)

    @staticmethod
    def _renumber_request(body: bytes, offset: int) -> bytes:
        data = json.loads(body)
        data["last_decision"] = max(0, data.get("last_decision", 0) - offset)
        for ack in data.get("applied", []):
            ack["number"] -= offset
        return json.dumps(data).encode()

    def _rewrite(self, data: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
        add = rule.get("add", {})
        data.update(add.get("top", {}))
        for d in data.get("decisions", []):
            d.update(add.get("decisions", {}))
            d["number"] += rule.get("renumber", 0)
        if "actions" in add:
            data["actions"].extend(add["actions"])
        for knob in data.get("knobs", {}).values():
            if isinstance(knob, dict):  # a registration's knob specs (an ingest answer's knobs are values)
                knob.update(add.get("knobs", {}))
        if "policy" in add:
            data["policy"].update(add["policy"])
        if rule.get("stuck"):
            if self.remembered is None and data["decisions"]:
                self.remembered = data["decisions"]
            if self.remembered is not None:
                data["decisions"], data["more_decisions"] = self.remembered, True
        return data


class BacklogWatch(TrainerCallback):
    """The sender's backlog as training sees it at every step boundary; sets ``release`` once the
    sender has dropped ``drops`` observations (however fast the steps on a loaded machine)."""

    def __init__(self, release: threading.Event, drops: int) -> None:
        self.release, self.drops = release, drops
        self.cb: ActuatorCallback | None = None  # set by train()
        self.samples: list[int] = []

    def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        sender = self.cb.session.sender if self.cb is not None else None
        if sender is not None:
            self.samples.append(sender.backlog)
            if sender.stats.dropped >= self.drops:
                self.release.set()


def train(tmp_path: Path, tokenizer: Any, url: str, *, steps: int = 40, every: int = 2,
          watch: BacklogWatch | None = None, **kw: Any) -> tuple[ActuatorCallback, list[float]]:
    """A tiny Trainer under ActuatorCallback at ``url``; the lr each optimizer step really used."""
    trainer = make_trainer(tmp_path, tokenizer, steps=steps, scheduler="constant")
    used = record_lr_used(trainer)
    cb = ActuatorCallback(POLICY, connection=Connection(url, flush_timeout=15.0, **kw), knobs=KNOBS,
                          reporting=Reporting(budget_share=1.0),
                          probes=[KLDrift(HELD_OUT, tokenizer, every=every, max_length=32)]).attach(trainer)
    trainer.add_callback(SlowSteps(0.03))
    if watch is not None:
        watch.cb = cb
        trainer.add_callback(watch)
    trainer.train()
    assert trainer.state.global_step == steps
    assert cb.session.sender is not None
    return cb, used


def stored_seqs(service: Service, run_id: str) -> list[int]:
    view = StoreView(service.env["ACTUATOR_DATABASE_URL"])
    try:
        return view.seqs(run_id)
    finally:
        view.close()


def assert_all_delivered(service: Service, cb: ActuatorCallback) -> None:
    assert cb.session.run_id is not None and cb.session.sender is not None
    assert stored_seqs(service, cb.session.run_id) == list(range(cb.session.seq)), f"of {cb.session.seq} observations"
    assert cb.session.sender.stats.dropped == 0 and cb.session.sender.backlog == 0, cb.session.sender.stats


def assert_decisions_applied(service: Service, cb: ActuatorCallback, used: list[float], offset: int = 0) -> None:
    """Decisions came back and each was applied once, in order, at the value the service ordered,
    and the optimizer's next step ran with it (``offset``: the front's shift of decision numbers);
    one that arrived at a boundary with a newer one on its knob was set aside, superseded by it."""
    numbers = [e["number"] for e in cb.session.applied]
    assert len(numbers) >= 4 and numbers == sorted(set(numbers)) and numbers[0] >= offset + 1, numbers
    stored = httpx.get(f"{service.url}/v1/runs/{cb.session.run_id}/decisions", params={"limit": 1000}).json()["items"]
    by_number = {d["number"] + offset: d for d in stored}
    for number in set(range(offset + 1, numbers[-1])) - set(numbers):
        if number <= MAX_INT:  # (no acknowledgement carries a number past the wire's)
            assert "superseded by decision" in (by_number[number]["skipped"] or ""), by_number[number]
    in_effect: dict[int, float] = {}  # step boundary -> the value the last decision applied there set
    for entry in cb.session.applied:
        assert entry["applied"] == pytest.approx(by_number[entry["number"]]["new_value"], rel=1e-12)
        in_effect[entry["step"]] = entry["applied"]
    # optimizer step k+1 is used[k] (global_step counts from 1); the final boundary has no next step
    for step, value in in_effect.items():
        if step < len(used):
            assert used[step] == pytest.approx(value, rel=1e-12), (step, value, used)
    assert sum(step < len(used) for step in in_effect) >= 3


def warnings_with(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


@pytest.mark.parametrize("case", _cases())
def test_hostile_answer(case: dict[str, Any], tmp_path: Path, char_tokenizer: Any, module_service: Service,
                        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    sender_with(monkeypatch)
    front = Front(module_service.url, case)
    with ServedApp(front.app) as served, caplog.at_level(logging.INFO, logger="actuator.agents"):
        cb, used = train(tmp_path, char_tokenizer, served.url)
    assert cb.session.sender is not None
    stats, expect = cb.session.sender.stats, case["expect"]
    assert_all_delivered(module_service, cb)
    assert_decisions_applied(module_service, cb, used)
    if expect in ("delivered", "registered"):
        assert stats.outages == 0 and stats.failures == 0, stats
        assert front.count["register"] == 1
    if expect in ("outage", "oversize"):
        # the unreadable answers are one outage: counted, warned once, retried until the service answered
        assert stats.outages == 1 and stats.failures == case["times"], stats
        assert len(warnings_with(caplog, "controller unreachable")) == 1, caplog.text
        assert warnings_with(caplog, "reachable again")
        assert getattr(stats, "oversize", 0) == (case["times"] if expect == "oversize" else 0), stats
    if expect == "oversize":  # abandoned unread, and said why
        assert "over this agent's limit of 2,000,000 bytes" in warnings_with(caplog, "controller unreachable")[0]
    if expect == "uncontrolled":
        # training started without control, said so loudly, and the sender registered the run later
        loud = warnings_with(caplog, "control is OFF")
        assert len(loud) == 1 and "controller unreachable" in loud[0], caplog.text
        assert warnings_with(caplog, "control is ON")
        assert front.count["register"] == 2 and stats.outages == 1


def test_an_answer_that_never_advances_asks_a_bounded_number_of_times(tmp_path: Path, char_tokenizer: Any,
                                                                      module_service: Service,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Every answer repeats the same decisions and says more follow: the agent asks again at most
    FOLLOW_UPS times per batch, stops as soon as an answer brings nothing new, warns once, and keeps
    delivering observations."""
    sender_with(monkeypatch)
    front = Front(module_service.url, {"answer": "ingest", "stuck": True})
    with ServedApp(front.app) as served, caplog.at_level(logging.INFO, logger="actuator.agents"):
        cb, used = train(tmp_path, char_tokenizer, served.url)
    assert front.remembered, "the service decided something for the front to repeat"
    assert_all_delivered(module_service, cb)
    new_posts = front.count["ingest"] - front.follow_ups
    print(f"\nnever-advancing answer: {new_posts} posts of new observations, {front.follow_ups} follow-ups")
    assert front.follow_ups <= new_posts * FOLLOW_UPS
    assert len(warnings_with(caplog, "brings no decision after")) == 1, caplog.text
    # the repeated decisions were applied once each
    numbers = [e["number"] for e in cb.session.applied]
    assert numbers == [d["number"] for d in front.remembered]


def test_a_drip_fed_answer_is_cut_at_its_deadline_and_the_backlog_keeps_its_limit(
        tmp_path: Path, char_tokenizer: Any, module_service: Service, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Ingest answers drip one byte every 0.1 s (each read is quick, so only a total deadline ends
    them) until the agent has had to drop 5 observations: each request is abandoned at its deadline
    as an outage; meanwhile the backlog stays within max_buffer, the oldest observations dropped,
    counted and warned with the count; every observation not dropped is delivered once the service
    answers again."""
    limit, deadline = 12, 0.5
    sender_with(monkeypatch, max_buffer=limit)
    front = Front(module_service.url, {"answer": "ingest", "drip": 0.1})
    watch = BacklogWatch(front.release, drops=5)
    with ServedApp(front.app) as served, caplog.at_level(logging.INFO, logger="actuator.agents"):
        cb, _ = train(tmp_path, char_tokenizer, served.url, steps=60, every=1, timeout=deadline, watch=watch)
    assert cb.session.sender is not None and cb.session.run_id is not None
    stats = cb.session.sender.stats
    print(f"\ndrip: backlog at most {max(watch.samples)} (limit {limit}), {stats.dropped} dropped of {cb.session.seq}, "
          f"{stats.failures} requests abandoned, {front.count['ingest']} ingest requests")
    assert front.release.is_set(), "observations were dropped while the answers dripped"
    # every dripping request was abandoned (the agent moved on), and they were one outage
    assert stats.outages == 1 and stats.failures >= 1 and front.count["ingest"] > stats.failures, stats
    timed_out = warnings_with(caplog, "controller unreachable")
    assert len(timed_out) == 1 and f"no complete answer within {deadline:g} s" in timed_out[0], timed_out
    # the limit held at every step boundary, and what it cost is counted and said
    assert max(watch.samples) <= limit and stats.dropped > 0
    seqs = stored_seqs(module_service, cb.session.run_id)
    assert len(seqs) + stats.dropped == cb.session.seq and seqs[-1] == cb.session.seq - 1 and cb.session.sender.backlog == 0
    dropped = warnings_with(caplog, "dropped")
    assert len(dropped) == 2, dropped  # when dropping starts, and the total when it ends
    assert f"limit of {limit} observations" in dropped[0]
    assert re.search(rf"\b{stats.dropped} observations were dropped", dropped[1]), dropped


def test_decisions_numbered_past_2_31_apply(tmp_path: Path, char_tokenizer: Any, module_service: Service,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A controller numbering its decisions from 2^31-1 on: every one is applied, once, in order,
    and the optimizer runs with it."""
    sender_with(monkeypatch)
    offset = MAX_INT - 1  # the service's decision 1 reaches the agent as 2^31-1
    front = Front(module_service.url, {"answer": "ingest", "renumber": offset})
    with ServedApp(front.app) as served:
        cb, used = train(tmp_path, char_tokenizer, served.url, steps=50)
    assert_all_delivered(module_service, cb)
    assert_decisions_applied(module_service, cb, used, offset=offset)
