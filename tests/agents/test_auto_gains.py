"""gains auto on a real Trainer.train() with the real service: the agent runs a step test on the
learning rate inside the scheduler's warm-up without being asked to (no identify=), declares it
at registration, and the service fits the plant at the window's end, tunes the controller (SIMC,
replay), records the fit and the gains as an event and controls with them from then on. The
probe *is* a known plant: a first-order response to ln(learning rate) computed in the probe, so
the fit and the decisions can be checked against it. A probe that does not answer the knob gives
a refused fit: the fallback gains, an event and a warning."""

from __future__ import annotations

import logging
import math
import time

import httpx
import pytest

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.probes import Probe
from actuator.controllers.identify import FittedModel
from actuator.controllers.tuning import simc
from actuator.engine import Engine
from actuator.policy import load_policy
from actuator.run_state import RunContext
from actuator.schemas import ObservationCreate
from actuator.store import Store

from agent_helpers import make_trainer

LR, GAIN, TAU, Y0, WARMUP, STEPS = 5e-3, 0.8, 2.0, 1.0, 12, 40
KNOBS = {"learning_rate": {"min": 1e-5, "max": 1e-1, "max_step": 0.5}}
FALLBACK = {"kp": 0.5, "ki": 0.1}


def policy(name: str, setpoint: float = 1.2) -> dict:
    return {"name": name, "controllers": [{"name": "hold", "probe": "custom.plant", "knob": "learning_rate",
                                           "setpoint": setpoint, "gains": "auto", **FALLBACK}]}


class Plant(Probe):
    """``y = Y0 + gain * (x - ln LR)``, ``tau dx/dt = ln(knob) - x``: exact between readings, the
    knob (the schedule's peak) held at the value read at the previous reading."""

    name = "plant"

    def __init__(self, trainer, gain: float) -> None:
        self._init_schedule(1, False)
        self.trainer, self.gain = trainer, gain
        self.x = self.u = math.log(LR)
        self.last: int | None = None

    def _measure(self, model, *, max_examples=None):
        step = self.trainer.state.global_step
        if self.last is not None and step > self.last:
            self.x = self.u + (self.x - self.u) * math.exp(-(step - self.last) / TAU)
        self.last = step
        self.u = math.log(self.trainer.lr_scheduler.base_lrs[0])  # in effect from the next step on
        return {"custom.plant": Y0 + self.gain * (self.x - math.log(LR))}


def train(tmp_path, tokenizer, service, gain: float, name: str, setpoint: float = 1.2, lrs: list | None = None,
          pause: float = 0.0, **schedule):
    schedule = schedule or {"scheduler": "linear", "warmup_steps": WARMUP}
    trainer = make_trainer(tmp_path, tokenizer, steps=STEPS, lr=LR, **schedule)
    cb = ActuatorCallback(policy(name, setpoint), connection=service.url, knobs=KNOBS, probes=[Plant(trainer, gain)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    if lrs is not None:  # the peak rate the optimizer really ran each step at
        from transformers import TrainerCallback

        class Rates(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                lrs.append((state.global_step, trainer.lr_scheduler.base_lrs[0]))

        trainer.add_callback(Rates())
    if pause:  # tiny steps take milliseconds: give the service's answers time to land inside the warm-up
        from transformers import TrainerCallback

        class Pause(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step < WARMUP:
                    time.sleep(pause)

        trainer.add_callback(Pause())
    trainer.train()
    run = cb.session.run_id
    events = httpx.get(f"{service.url}/v1/runs/{run}/events", params={"limit": 500}).json()
    decisions = httpx.get(f"{service.url}/v1/runs/{run}/decisions", params={"limit": 500}).json()["items"]
    store = Store(service.env["ACTUATOR_DATABASE_URL"])
    try:
        observations = [ObservationCreate(seq=o.seq, step=o.step, probes=o.probes, metrics=o.metrics, knobs=o.knobs)
                        for o in store.list_observations(run, limit=10_000)]
    finally:
        store.close()
    return events, decisions, observations


def replay(doc: dict, observations, end: int) -> list[tuple[str, int, float]]:
    """The decisions a plain (not auto) policy makes on the observations from ``end`` on."""
    engine = Engine(load_policy(doc))
    ctx = RunContext.from_json({"learning_rate": {"name": "learning_rate", "value": LR, "min": 1e-5, "max": 1e-1,
                                                  "scale": "log", "max_step": 0.5}})
    out = []
    for obs in observations:
        if obs.step >= end:
            out += [(d.knob, d.step, d.new_value) for d in engine.observe(ctx, obs).decisions]
    return out


def same(made: list[tuple[str, int, float]], replayed: list[tuple[str, int, float]]) -> None:
    assert [(k, s) for k, s, _ in made] == [(k, s) for k, s, _ in replayed]
    assert [v for *_, v in made] == pytest.approx([v for *_, v in replayed], rel=1e-9)


def payloads(events: list[dict], kind: str) -> list[dict]:
    return [e["payload"] for e in events if e["kind"] == kind]


def test_auto_gains_tunes_at_warmup_and_controls_with_them(tmp_path, char_tokenizer, sqlite_service, caplog):
    caplog.set_level(logging.WARNING, logger="actuator")
    # the setpoint lies beyond where the step test takes the plant (1.4): the test runs to its end
    events, decisions, observations = train(tmp_path, char_tokenizer, sqlite_service, GAIN, "auto-plant",
                                            setpoint=1.6)
    tuned = payloads(events, "auto_gains")
    assert len(tuned) == 1 and not payloads(events, "auto_gains_fallback"), events
    ev = tuned[0]
    start, end = ev["window"]
    assert start == 0 and end <= WARMUP, "the step test runs inside the scheduler's warm-up"
    fit = ev["fit"]
    assert fit["model"] == "fopdt"
    assert fit["gain"] == pytest.approx(GAIN, rel=0.05) and fit["tau"] == pytest.approx(TAU, rel=0.15)
    assert fit["theta"] < 0.5 and fit["r2"] > 0.99
    assert ev["predicted"]["settling_steps"] is not None
    # the stored gains are SIMC's for the stored fit (probe every step; the replay picks the weight)
    model = FittedModel(kind="fopdt", gain=fit["gain"], tau=fit["tau"], theta=fit["theta"], offset=0, transient=0,
                        drift=0, u_ref=0, r2=fit["r2"], nrmse=0, observations=0, steps=0, knob_move=0,
                        residual_sd=0, theta_hi=fit["theta"])
    want = simc(model, interval=1)
    gains = ev["gains"]
    assert gains["gains"] == "absolute" and gains["direction"] == "direct"
    assert (gains["kp"], gains["ki"], gains["kd"]) == pytest.approx((want.kp, want.ki, want.kd), rel=0.15)
    # no decision on the knob was ordered during the test; those after it are the tuned gains'
    assert decisions and all(d["step"] > end for d in decisions)
    made = [(d["knob"], d["step"], d["new_value"]) for d in sorted(decisions, key=lambda d: d["number"])]
    tuned_doc = policy("replay", 1.6)
    tuned_doc["controllers"][0].update(gains="absolute", kp=gains["kp"], ki=gains["ki"], kd=gains["kd"],
                                       setpoint_weight=gains["setpoint_weight"])
    same(made, replay(tuned_doc, observations, end))
    fallback_doc = policy("replay", 1.6)
    fallback_doc["controllers"][0]["gains"] = "relative"
    with pytest.raises(AssertionError):
        same(made, replay(fallback_doc, observations, end))
    assert any("tuned from the warm-up step test" in r.getMessage() for r in caplog.records)


def test_a_plant_that_does_not_answer_falls_back_with_a_warning(tmp_path, char_tokenizer, sqlite_service, caplog):
    caplog.set_level(logging.WARNING, logger="actuator")
    events, decisions, observations = train(tmp_path, char_tokenizer, sqlite_service, 0.0, "auto-deaf")
    assert not payloads(events, "auto_gains")
    fallback = payloads(events, "auto_gains_fallback")
    assert len(fallback) == 1, events
    ev = fallback[0]
    assert ev["problem"] == "no_response" and ev["gains"] == {"gains": "relative", **FALLBACK, "kd": 0.0,
                                                              "direction": "direct", "setpoint_weight": 0.0}
    warned = [r.getMessage() for r in caplog.records if "could not be fitted" in r.getMessage()]
    assert warned and "keeps its fallback gains" in warned[0]
    end = ev["step"]  # the first observation at or after the step test's end: the law runs from there
    assert 0 < end <= WARMUP
    made = [(d["knob"], d["step"], d["new_value"]) for d in sorted(decisions, key=lambda d: d["number"])]
    fallback_doc = policy("replay")
    fallback_doc["controllers"][0]["gains"] = "relative"
    assert made
    same(made, replay(fallback_doc, observations, end))


def test_a_constant_schedule_sizes_the_test_to_a_tenth_of_max_steps(tmp_path, char_tokenizer, sqlite_service):
    """No warm-up and a constant schedule: the test fits in the first 10% of the Trainer's
    max_steps (the callback passes them at train start; without them the test ran 20 steps)."""
    events, _, _ = train(tmp_path, char_tokenizer, sqlite_service, 0.0, "auto-constant", scheduler="constant",
                         warmup_steps=0)
    (ev,) = payloads(events, "auto_gains_fallback")
    assert 0 < ev["step"] <= STEPS // 10


def test_a_schedule_of_the_users_own_sizes_the_test_to_its_warmup(tmp_path, char_tokenizer, sqlite_service):
    """``Trainer(optimizers=(opt, get_linear_schedule_with_warmup(opt, 8, ...)))`` with no warm-up in
    the TrainingArguments: the step test fits the schedule's own 8 warm-up steps, not 10% of
    max_steps (4), as the docs promise ("the scheduler's warm-up where there is one")."""
    import torch
    from transformers import get_linear_schedule_with_warmup

    trainer = make_trainer(tmp_path, char_tokenizer, steps=STEPS, lr=LR, scheduler="constant", warmup_steps=0)
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=LR)
    trainer.lr_scheduler = get_linear_schedule_with_warmup(trainer.optimizer, 8, STEPS)
    cb = ActuatorCallback(policy("auto-own-schedule"), connection=sqlite_service.url, knobs=KNOBS,
                          probes=[Plant(trainer, 0.0)], reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.train()
    auto = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()["controllers"]["hold"]["auto"]
    assert (auto["start"], auto["end"]) == (0, 8)


def test_a_probe_that_passes_its_setpoint_ends_the_step_test_early(tmp_path, char_tokenizer, sqlite_service, caplog):
    """The step test moves the rate up (x1.65) and the plant rises from 1.0 toward 1.4, past a
    setpoint of 1.2 at step 5 of the 12-step test. The service ends the test there (fitting the
    readings it has), the controller's first decisions reach the agent inside the window, and the
    agent ends its test on them: the rate the optimizer runs at is the controller's from then on,
    and the window's end restores nothing."""
    caplog.set_level(logging.WARNING, logger="actuator")
    lrs: list = []
    events, decisions, _ = train(tmp_path, char_tokenizer, sqlite_service, GAIN, "auto-passed", setpoint=1.2, lrs=lrs,
                                 pause=0.4)
    (ev,) = payloads(events, "auto_gains_fallback") + payloads(events, "auto_gains")
    said = ev.get("reason") or " ".join(ev.get("warnings", []))
    assert "the step test ended early at step" in said, ev
    assert ev["step"] < WARMUP and ev.get("window", [0, ev["step"]])[1] == ev["step"]
    first = min(decisions, key=lambda d: d["number"])
    assert first["controller"] == "hold" and first["new_value"] < LR * math.exp(0.5)  # over its setpoint: lower
    assert first["applied_step"] is not None and first["applied_step"] < WARMUP, first
    ran = dict(lrs)  # step boundary -> the rate of the step after it
    at_first = [d for d in sorted(decisions, key=lambda d: d["number"]) if d["applied_step"] == first["applied_step"]]
    assert ran[first["applied_step"]] == pytest.approx(at_first[-1]["applied_value"], rel=1e-9)
    # nothing put the test's nominal rate back at the window's end: the controller's value stands
    by_end = [d for d in sorted(decisions, key=lambda d: d["number"])
                  if d["applied_step"] is not None and d["applied_step"] <= WARMUP]
    assert ran[WARMUP] == pytest.approx(by_end[-1]["applied_value"], rel=1e-9)
    assert any("ended the step test" in r.getMessage() for r in caplog.records)
