"""Duplicate and out-of-order delivery, at the service and at the agent.

The service is idempotent on (run, seq): whatever order and however often observations arrive,
each is stored once, and an observation older than one already evaluated is kept for the record
but moves nothing (no controller update, no guardrail count, no latest value). The agent applies
each decision once, in order, even when responses arrive twice or stale.
"""

from __future__ import annotations

import functools

import httpx
import pytest

import actuator.agents.session as session_module  # the session builds the sender and client
from actuator.agents.callback import ActuatorCallback, Connection, Reporting
from actuator.agents.probes import KLDrift
from actuator.client import ActuatorClient
from agent_helpers import HELD_OUT, SlowSteps, make_trainer, record_lr_used
from harden import StoreView, post_obs, register

FRESH, LATE_BREACH = 0.3, 5.0  # POLICY's guardrail "cap" fires above 0.8 twice in a row


def test_shuffled_and_repeated_delivery_is_idempotent(service, database_url):
    run = register(service.url)
    # seq -> step; the agent took them in this order
    steps = {s: 10 * (s + 1) for s in range(12)}

    def obs(seq: int, drift: float = FRESH) -> dict:
        return {"seq": seq, "step": steps[seq], "probes": {"kl_drift": drift}, "knobs": {"learning_rate": 1e-3}}

    deliveries = [
        [obs(0)], [obs(2), obs(1)], [obs(1)],  # a batch out of order, then a redelivery
        [obs(4)], [obs(3, LATE_BREACH)],  # seq 3 arrives after seq 4: late
        [obs(5), obs(4), obs(3, LATE_BREACH)],  # a retry of everything: duplicates and one new
        [obs(9)], [obs(6, LATE_BREACH), obs(7, LATE_BREACH), obs(8, LATE_BREACH)],  # three late ones
        [obs(9)], [obs(11), obs(10)], [obs(10)], [obs(11)],
    ]
    accepted = duplicates = 0
    decision_numbers: list[int] = []
    last = 0
    for batch in deliveries:
        r = post_obs(service.url, run, batch, last_decision=last)
        assert r.status_code == 200, r.text
        body = r.json()
        accepted += body["accepted"]
        duplicates += body["duplicates"]
        for d in body["decisions"]:
            assert d["number"] > last  # only what the agent has not acknowledged
            decision_numbers.append(d["number"])
            last = d["number"]
        assert not body["breached"] and not body["actions"], body
    assert accepted == 12 and duplicates == sum(len(b) for b in deliveries) - 12

    view = StoreView(database_url)
    try:
        assert view.seqs(run["id"]) == list(range(12))
        stored = view.store.get_run(run["id"])
        late = {3, 6, 7, 8}
        # late observations moved nothing: no guardrail count (two "breaches" arrived in a row),
        # no controller update, the latest value is the newest step's
        assert stored.guardrails["cap"]["breaches"] == 0 and not stored.guardrails["cap"]["active"]
        assert stored.controllers["drift"]["pid"]["updates"] == 12 - len(late)
        assert stored.controllers["drift"]["last_step"] == steps[11]
        assert stored.latest_probes == {"kl_drift": FRESH} and stored.last_step == steps[11]
        assert not [e for e in view.store.list_events(run["id"]) if e.kind == "guardrail_breach"]
        # decisions: numbered 1..n without gaps, each returned once to an agent that acknowledges
        assert decision_numbers == list(range(1, stored.decision_count + 1))
    finally:
        view.close()


class ChaosTransport(httpx.HTTPTransport):
    """Every request is delivered twice; every other answer the agent gets is a stale one (the
    answer to its previous request) instead of the current one."""

    def __init__(self) -> None:
        super().__init__()
        self.previous: httpx.Response | None = None
        self.calls = 0
        self.duplicates_sent = 0
        self.stale_answers = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        first = super().handle_request(request)
        first.read()
        if not request.url.path.endswith("/observations"):
            return first
        second = super().handle_request(request)  # the network delivered it twice
        second.read()
        self.duplicates_sent += 1
        self.calls += 1
        stale, self.previous = self.previous, second
        if stale is not None and self.calls % 2 == 0:
            self.stale_answers += 1
            return stale
        return second


def test_agent_applies_each_decision_once_under_duplicate_and_stale_answers(tmp_path, char_tokenizer,
                                                                           sqlite_service, monkeypatch):
    chaos = ChaosTransport()
    monkeypatch.setattr(session_module, "ActuatorClient", functools.partial(ActuatorClient, transport=chaos))
    steps = 60
    trainer = make_trainer(tmp_path, char_tokenizer, steps=steps, scheduler="constant")
    used = record_lr_used(trainer)
    policy = {"name": "chaos", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                                "setpoint": 0.0, "kp": 0.5, "ki": 0.1}]}
    cb = ActuatorCallback(policy, connection=Connection(sqlite_service.url, flush_timeout=10.0),
                          knobs={"learning_rate": {"min": 1e-7, "max": 1e-2, "max_step": 0.2}},
                          probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(SlowSteps(0.04))
    trainer.train()

    assert trainer.state.global_step == steps
    print(f"\nchaos: {chaos.duplicates_sent} posts delivered twice, {chaos.stale_answers} stale answers, "
          f"{len(cb.session.applied)} decisions applied")
    assert chaos.duplicates_sent >= 8 and chaos.stale_answers >= 4
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions", params={"limit": 1000}).json()
    by_number = {d["number"]: d for d in decisions["items"]}
    numbers = [e["number"] for e in cb.session.applied]
    assert len(numbers) >= 3
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers), numbers  # once each, in order
    for entry in cb.session.applied:
        assert entry["applied"] == pytest.approx(by_number[entry["number"]]["new_value"], rel=1e-12)
    # the optimizer's lr only ever changed when a decision was applied
    changes = sum(1 for a, b in zip(used, used[1:]) if a != b)
    assert changes <= len(numbers)
    # every observation stored once although every post was delivered twice
    view = StoreView(sqlite_service.env["ACTUATOR_DATABASE_URL"])
    try:
        assert view.seqs(cb.session.run_id) == list(range(cb.session.seq))
    finally:
        view.close()
    text = httpx.get(f"{sqlite_service.url}/metrics").text
    dup = next(line for line in text.splitlines() if line.startswith("actuator_observations_duplicate_total"))
    assert float(dup.split()[-1]) >= chaos.duplicates_sent


class FirstPostFails(httpx.HTTPTransport):
    """The first observation post gets a 503 (so the next ones pile up into one batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if not self.failed and request.url.path.endswith("/observations"):
            self.failed = True
            return httpx.Response(503, json={"detail": "try later"}, request=request)
        return super().handle_request(request)


def test_one_refused_observation_does_not_take_its_batch_with_it(sqlite_service):
    """The sender batches what is queued; when the service refuses a batch (4xx: here one
    observation names a knob the run does not have), the sender resends its observations one by
    one and only the refused one is dropped."""
    from actuator.agents.sender import BackgroundSender
    from actuator.schemas import ObservationCreate

    run = register(sqlite_service.url)
    client = ActuatorClient(sqlite_service.url, transport=FirstPostFails())
    sender = BackgroundSender(client, run_id=run["id"], token=run["token"], initial_backoff=0.3, max_backoff=0.3)
    try:
        for seq in range(10):
            knobs = {"kl_beta": 0.1} if seq == 4 else {"learning_rate": 1e-3}
            sender.submit(ObservationCreate(seq=seq, step=seq + 1, probes={"kl_drift": 0.2}, knobs=knobs))
        assert sender.flush(20)
        assert sender.stats.outages == 1 and sender.stats.sent == 9
    finally:
        sender.close(1.0)
        client.close()
    view = StoreView(sqlite_service.env["ACTUATOR_DATABASE_URL"])
    try:
        assert view.seqs(run["id"]) == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    finally:
        view.close()
