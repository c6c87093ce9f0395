"""Issue 56, the service side: the policy's ``rewind`` section is validated with errors naming the
field (422 over REST, nothing stored), and the engine climbs the escalation ladder: each firing of a
rollback guardrail within the window takes the next rung (damp, rewind, halt), each rung an event
with its reason and the last step at which every guardrail held."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from actuator.engine import Engine, RunContext
from actuator.policy import PolicyDocument
from actuator.schemas import ObservationCreate

GUARD = {"name": "g", "probe": "custom.x", "bound": "upper", "threshold": 1.0, "action": "rollback",
         "knob": "learning_rate", "factor": 0.5}
LADDER = {"window": 10, "rungs": [{"action": "adjust"}, {"action": "rollback", "times": 2}, {"action": "halt"}]}


def _doc(rewind, guardrails=(GUARD,)):
    return {"name": "rw", "guardrails": list(guardrails), "rewind": rewind}


@pytest.mark.parametrize("rewind,loc,words", [
    ({"ladder": {"window": 10, "rungs": [{"action": "rollback"}]}}, "rewind.ladder.rungs", "last rung must be 'halt'"),
    ({"ladder": {"window": 0, "rungs": [{"action": "halt"}]}}, "rewind.ladder.window", "greater than or equal to 1"),
    ({"data": "replay"}, "rewind.data", "'replay' is not supported"),
    ({"keep_best": {"probe": "nonsense", "mode": "max"}}, "rewind.keep_best.probe", "unknown probe"),
    ({"keep_best": {"probe": "custom.x", "mode": "up"}}, "rewind.keep_best.mode", "'max' or 'min'"),
    ({"healthy_saves": {"keep": 0}}, "rewind.healthy_saves.keep", "greater than or equal to 1"),
    ({"healthy_saves": {"keep": 2, "evry": 3}}, "rewind.healthy_saves.evry", "Extra inputs"),
])
def test_bad_rewind_sections_name_their_field(rewind, loc, words):
    with pytest.raises(ValidationError) as info:
        PolicyDocument.model_validate(_doc(rewind))
    text = str(info.value)
    assert loc in text and words in text, text


def test_an_adjust_rung_needs_the_guardrails_knob():
    bare = {**GUARD, "knob": None}
    with pytest.raises(ValidationError, match=r"rewind.ladder.rungs: an 'adjust' rung damps .*\['g'\]"):
        PolicyDocument.model_validate(_doc({"ladder": LADDER}, [bare]))


def test_a_bad_rewind_section_is_a_422_and_stores_nothing(sqlite_service):
    url = sqlite_service.url
    r = httpx.post(f"{url}/v1/policies", json=_doc({"ladder": {"window": 5, "rungs": [{"action": "adjust"}]}}))
    assert r.status_code == 422, r.text
    assert "rewind.ladder.rungs" in r.text and "last rung must be 'halt'" in r.text
    assert httpx.get(f"{url}/v1/policies/rw").status_code == 404
    ok = httpx.post(f"{url}/v1/policies", json=_doc({"ladder": LADDER, "healthy_saves": {"keep": 3}}))
    assert ok.status_code == 201, ok.text
    stored = httpx.get(f"{url}/v1/policies/rw").json()
    assert stored["document"]["rewind"]["ladder"] == {**LADDER, "rungs": [
        {"action": "adjust", "times": 1}, {"action": "rollback", "times": 2}, {"action": "halt", "times": 1}]}


def _run(readings, ladder=LADDER):
    engine = Engine(PolicyDocument.model_validate(_doc({"ladder": ladder})))
    ctx = RunContext.from_json({"learning_rate": {"value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}})
    out = []
    for seq, (step, x) in enumerate(readings):
        result = engine.observe(ctx, ObservationCreate(seq=seq, step=step, probes={"custom.x": x}))
        out.append((step, result))
    return ctx, out


def test_the_ladder_damps_then_rewinds_twice_then_halts():
    ctx, out = _run([(1, 0.5), (2, 2.0), (3, 0.5), (4, 2.0), (5, 0.5), (6, 2.0), (7, 0.5), (8, 2.0)])
    fired = [(step, e) for step, r in out for e in r.events if e.kind == "guardrail_breach"]
    assert [(s, e.action, e.rung, e.healthy_step) for s, e in fired] == [
        (2, "adjust", 1, None), (4, "rollback", 2, 3), (6, "rollback", 2, 5), (8, "halt", 3, None)]
    assert "rung 2 of 3 of the rewind ladder: firing 2 within 10 steps; back to the newest checkpoint at or " \
           "before step 3, where every guardrail last held" in fired[1][1].reason
    actions = {s: [a.type for a in r.actions] for s, r in out}
    assert actions[2] == [] and actions[4] == ["rollback"] and actions[6] == ["rollback"] and actions[8] == ["halt"]
    damped = [d.new_value for _, r in out for d in r.decisions]
    assert damped == pytest.approx([5e-4, 2.5e-4, 1.25e-4])  # each damp and rewind halves the knob
    assert ctx.state == "halted"


def test_firings_older_than_the_window_are_forgotten():
    # firings at 2, 14, 26: 12 steps apart, each outside the 10-step window of the next: rung 1 every time
    ctx, out = _run([(1, 0.5), (2, 2.0), (3, 0.5), (14, 2.0), (15, 0.5), (26, 2.0)])
    rungs = [e.rung for _, r in out for e in r.events if e.kind == "guardrail_breach"]
    assert rungs == [1, 1, 1] and ctx.state == "running"
    assert ctx.guardrails["g"].rewinds == [26]  # what the run keeps: the firings still inside the window


def test_without_a_ladder_every_firing_rolls_back_as_before():
    engine = Engine(PolicyDocument.model_validate({"name": "rw", "guardrails": [GUARD]}))
    ctx = RunContext.from_json({"learning_rate": {"value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}})
    actions = []
    for seq, (step, x) in enumerate([(1, 0.5), (2, 2.0), (3, 0.5), (4, 2.0), (5, 0.5), (6, 2.0)]):
        r = engine.observe(ctx, ObservationCreate(seq=seq, step=step, probes={"custom.x": x}))
        actions += [a.type for a in r.actions]
        assert all(e.rung is None for e in r.events if e.kind == "guardrail_breach")
    assert actions == ["rollback"] * 3 and ctx.state == "running"


def _falls_back(reference):
    """A probe training improves (lower is better: 5 -> 3 -> 2), then a fall back to 3.5 and back to
    1.8; the guardrail is '+50%' relative to the first reading or to the best so far."""
    guard = {**GUARD, "threshold": "+50%", "reference": reference}
    engine = Engine(PolicyDocument.model_validate({"name": "rw", "guardrails": [guard]}))
    ctx = RunContext.from_json({"learning_rate": {"value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}})
    fired = []
    for seq, (step, x) in enumerate([(0, 5.0), (2, 3.0), (4, 2.0), (6, 3.5), (8, 1.8)]):
        r = engine.observe(ctx, ObservationCreate(seq=seq, step=step, probes={"custom.x": x}))
        fired += [e for e in r.events if e.kind == "guardrail_breach"]
    return ctx, fired


def test_a_threshold_relative_to_the_best_reading_catches_a_fall_the_first_reading_hides():
    ctx, fired = _falls_back("best")
    assert [(e.step, e.value, e.threshold) for e in fired] == [(6, 3.5, pytest.approx(3.0))]  # +50% of 2.0
    assert "custom.x 3.5 above threshold 3 (+50% of the best reading so far, 2) at step 6" in fired[0].reason
    assert ctx.guardrails["g"].baseline == 1.8  # the best so far, after the recovery
    ctx_first, fired_first = _falls_back("first")
    assert fired_first == [] and ctx_first.guardrails["g"].baseline == 5.0  # +50% of 5.0 is 7.5: never


def test_reference_best_needs_a_relative_threshold():
    with pytest.raises(ValidationError, match="reference 'best' is for a relative threshold"):
        PolicyDocument.model_validate({"name": "rw", "guardrails": [{**GUARD, "reference": "best"}]})
    with pytest.raises(ValidationError, match="guardrails.0.reference"):
        PolicyDocument.model_validate({"name": "rw", "guardrails": [{**GUARD, "threshold": "+5%", "reference": "top"}]})
