"""Live state: ``publish_many`` is ``touch`` plus ``publish`` of each event, in one go."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from actuator.live import MemoryLive, RedisLive

EVENTS: list[dict[str, Any]] = [
    {"kind": "guardrail_breach", "step": 3, "guardrail": "cap", "value": 5.5, "threshold": 5.0},
    {"kind": "observation", "seq": 1, "step": 3, "probes": {"kl": 0.2}, "knobs": {"lr": 1e-4}},
    {"kind": "observation", "seq": 2, "step": 4, "probes": {}, "knobs": {}},
    {"kind": "decision", "number": 1, "step": 5, "knob": "lr", "old_value": 1e-4, "new_value": 9e-5,
     "reason": "kl 0.2 above setpoint 0.1: lr 0.0001 -> 9e-05"},
]


@pytest.fixture(params=["memory", "redis"])
def live(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        yield MemoryLive()
        return
    server = request.getfixturevalue("redis_server")
    lv = RedisLive(server.url)
    yield lv
    lv.close()


def test_publish_many_is_publish_of_each_in_order(live: Any) -> None:
    one, many = f"one-{uuid.uuid4().hex}", f"many-{uuid.uuid4().hex}"
    for ev in EVENTS:
        live.publish(one, ev)
    live.publish_many(many, EVENTS[:1])
    live.publish_many(many, iter(EVENTS[1:]))  # any iterable
    assert live.recent(many) == live.recent(one) == list(enumerate(EVENTS, start=1))
    assert live.recent(many, after=2) == [(3, EVENTS[2]), (4, EVENTS[3])]
    # Interleaved with single publishes, the ids stay one sequence.
    live.publish(many, {"kind": "state", "to": "paused", "reason": "r"})
    live.publish_many(many, [{"kind": "state", "to": "running", "reason": "r"}])
    assert [i for i, _ in live.recent(many)] == [1, 2, 3, 4, 5, 6]
    assert live.recent(many, after=4)[-1][1]["to"] == "running"


def test_publish_many_touches_only_when_asked(live: Any) -> None:
    run = f"touch-{uuid.uuid4().hex}"
    live.publish_many(run, EVENTS[:1])
    assert live.last_seen(run) is None
    live.publish_many(run, [], touch=7)  # nothing to publish: still a touch
    seen = live.last_seen(run)
    assert seen is not None
    live.publish_many(run, EVENTS[1:], touch=8)
    assert live.last_seen(run) >= seen
    assert [e for _, e in live.recent(run)] == EVENTS
    live.publish_many(run, [])  # nothing at all: no round trip, no error
