"""The knob and probe catalogue (actuator/catalogue.py): one definition per knob and probe, the one
``limit()`` every knob value goes through, and agreement between the catalogue, the agent's
registered setters and the docs tables (docs/reference/knobs-and-probes.md)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from actuator._exceptions import ConfigError, PolicyError
from actuator.agents.knobs import _REGISTRY, knob_setter, registered_setters, setter_for
from actuator.catalogue import KNOBS, PROBES, Bounds, Knob, default_knob_spec, limit
from actuator.policy import load_policy
from actuator.controllers import PID, PIDConfig
from actuator.schemas import KnobSpec

LR = KnobSpec(name="learning_rate", value=1e-4, min=1e-6, max=1e-3, scale="log", max_step=0.7)


# -- limit() -----------------------------------------------------------------------------------


def test_limit_rate_limits_a_log_knob_by_a_factor():
    assert limit(LR, 1e-4, 1e-3) == pytest.approx(1e-4 * math.exp(0.7), rel=1e-12)
    assert limit(LR, 1e-4, 1e-6) == pytest.approx(1e-4 * math.exp(-0.7), rel=1e-12)


def test_limit_returns_a_value_no_limit_moved_exactly():
    # exp(log(1e-4)) != 1e-4: the value must not take a round trip through the scale
    assert limit(LR, 1.1e-4, 1e-4) == 1e-4
    assert limit(LR, None, 2e-5) == 2e-5


def test_limit_holds_a_bound_exactly():
    limits: set[str] = set()
    assert limit(LR, 9e-4, 5e-3, limits) == 1e-3
    assert limits == {"bounds"}


def test_limit_without_a_current_value_only_bounds():
    # the engine orders from the controller's output, which the law already rate-limited
    assert limit(LR, None, 1.0) == 1e-3
    assert limit(LR, None, 0.0) == 1e-6
    # on a log scale a current value of 0 (or not finite) has no rate window either
    assert limit(LR, 0.0, 1e-3) == 1e-3
    assert limit(LR, math.inf, 1e-3) == 1e-3


def test_limit_bounds_win_over_the_rate_limit():
    # a knob found outside its bounds is brought back at once
    spec = Bounds(0.0, 1.0, "linear", 0.2)
    limits: set[str] = set()
    assert limit(spec, 1.5, 0.5, limits) == 1.0
    assert limits == {"bounds", "rate"}
    assert limit(spec, 0.5, 0.9) == pytest.approx(0.7)


def test_limit_rounds_integer_knobs_half_up_inside_bounds_and_rate_window():
    rank = Bounds(1.0, 10.0, "integer", None)
    assert limit(rank, 5.0, 2.5) == 3.0
    assert limit(rank, None, 0.2) == 1.0
    assert limit(replace(rank, max_step=1.5), 5.0, 1.0) == 4.0  # 3.5 would round to 4 anyway
    assert limit(replace(rank, max_step=1.5), 5.0, 9.0) == 6.0  # 6.5 rounds up to 7, outside the window
    assert limit(replace(rank, min=1.5, max=2.4), None, 2.0) == 2.0


def test_limit_refuses_a_value_that_is_not_a_number():
    with pytest.raises(ValueError):
        limit(LR, 1e-4, math.nan)


@pytest.mark.parametrize("scale,lo,hi,step,cur,ordered", [
    ("log", 1e-6, 1e-3, 0.7, 1e-4, 9e-4),
    ("log", 1e-6, 1e-3, 0.3, 2e-4, 1e-5),
    ("linear", 0.0, 2.0, 0.25, 1.0, 0.1),
    ("integer", 1.0, 64.0, 3.0, 16.0, 40.0),
    ("integer", 1.0, 64.0, None, 16.0, 7.4),
])
def test_the_pid_output_clamp_is_limit(scale, lo, hi, step, cur, ordered):
    # a P-only law whose second update asks for `ordered`: what it outputs is limit()'s answer
    pid = PID(PIDConfig(setpoint=0.0, kp=1.0, out_min=lo, out_max=hi, scale=scale, max_step=step))
    state = pid.update(0.0, 1.0, cur).state
    to_scale = math.log if scale == "log" else float
    # measurement m gives P = kp * (0 - m) * sign(direct = +1) = -m; the output is P + integral
    target = to_scale(ordered) - state.integral
    out = pid.update(-target, 1.0, cur, state)
    limits: set[str] = set()
    assert out.value == pytest.approx(limit(Bounds(lo, hi, scale, step), cur, ordered, limits), rel=1e-12)
    assert set(out.limited_by) - {"overflow"} == limits


# -- default bounds ------------------------------------------------------------------------------


@pytest.mark.parametrize("name,value,expected", [
    ("learning_rate", 1e-4, {"min": 1e-6, "max": 1e-4, "scale": "log", "max_step": 0.7}),
    ("learning_rate", 0.0, {"min": 0.0, "max": 0.0, "scale": "linear", "max_step": None}),
    ("kl_beta", 0.1, {"min": 0.001, "max": 1.0, "scale": "log", "max_step": 0.7}),
    ("gkd_beta", 0.5, {"min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.2}),
    ("kl_weight", 0.0, {"min": 0.0, "max": 2.0, "scale": "linear", "max_step": 0.25}),
    ("distill_lambda", 0.5, {"min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.2}),
    ("distill_temperature", 2.0, {"min": 0.5, "max": 8.0, "scale": "log", "max_step": 0.4}),
    ("rank", 32.0, {"min": 1.0, "max": 32.0, "scale": "integer", "max_step": None}),
    ("rank", 0.0, {"min": 1.0, "max": 1.0, "scale": "integer", "max_step": None}),
    ("compression_threshold", 1.0, {"min": 1e-6, "max": 1e6, "scale": "log", "max_step": math.log(2.0)}),
    ("mlp_channel_threshold", 2.0, {"min": 2e-6, "max": 2e6, "scale": "log", "max_step": math.log(1.05)}),
    ("custom.thing", 3.0, {"min": 3.0, "max": 3.0, "scale": "linear", "max_step": None}),
])
def test_default_knob_spec(name, value, expected):
    got = default_knob_spec(name, value)
    assert got.keys() == expected.keys()
    for key, want in expected.items():
        assert got[key] == (pytest.approx(want, rel=1e-12) if isinstance(want, float) else want), key


# -- catalogue, setters and docs agree -------------------------------------------------------------

from catalogue_agreement import DOCS, PROBES_DOCS, disagreements, probe_class_disagreements  # noqa: E402


def test_catalogue_setters_and_docs_agree():
    assert disagreements(KNOBS, PROBES, registered_setters(), DOCS.read_text()) == []


def test_the_agreement_check_finds_a_knob_missing_from_the_docs_or_the_setters():
    docs, setters = DOCS.read_text(), registered_setters()
    row = next(line for line in docs.splitlines() if line.startswith("| `kl_beta` |"))
    assert disagreements(KNOBS, PROBES, setters, docs.replace(row + "\n", "")) == [
        "knob kl_beta: missing from ['docs']"]
    assert disagreements(KNOBS, PROBES, {k: v for k, v in setters.items() if k != "rank"}, docs) == [
        "knob rank: missing from ['setters']"]
    wrong = docs.replace("| `gkd_beta` | 0 | 1 | linear | 0.2 |", "| `gkd_beta` | 0 | 1 | linear | 0.3 |")
    assert [d.split(":")[0] for d in disagreements(KNOBS, PROBES, setters, wrong)] == ["knob gkd_beta"] * 2
    probe_row = next(line for line in docs.splitlines() if line.startswith("| `policy_kl` |"))
    assert disagreements(KNOBS, PROBES, setters, docs.replace(probe_row + "\n", "")) == [
        "probe policy_kl: missing from the docs"]


def _registered_probes() -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    from actuator.agents.probes import registered

    return ({n: r.keys for n, r in registered().items()}, {n: r.cls.__name__ for n, r in registered().items()})


def test_registered_probes_and_the_probes_docs_agree():
    keys, classes = _registered_probes()
    assert len(keys) >= 7  # the shipped ones, found by their registration (no list of classes here)
    assert probe_class_disagreements(keys, classes, PROBES_DOCS.read_text()) == []


def test_the_probes_agreement_finds_a_missing_row_or_registration():
    keys, classes = _registered_probes()
    docs = PROBES_DOCS.read_text()
    row = next(line for line in docs.splitlines() if line.startswith("| `PolicyKL("))
    assert probe_class_disagreements(keys, classes, docs.replace(row + "\n", "")) == [
        "probe class PolicyKL: missing from the probes docs"]
    assert probe_class_disagreements({k: v for k, v in keys.items() if k != "hotpotqa"}, classes, docs) == [
        "probe class HotpotQA: missing from the registry"]
    wrong = docs.replace("| `perplexity` | exp(mean", "| `perplexity`, `ppl` | exp(mean")
    assert probe_class_disagreements(keys, classes, wrong) == [
        "probe class Perplexity: docs list keys ['perplexity', 'ppl'], the registration ['perplexity']"]


def test_every_probe_key_names_a_registered_probe_that_produces_it():
    # compression.flops was listed once and produced by nothing; each key names what produces it
    from actuator.agents.probes import registered

    assert "compression.flops" not in PROBES
    assert {p.source for p in PROBES.values()} - {None} == set(registered())
    for name, registration in registered().items():
        assert {k for k, p in PROBES.items() if p.source == name} == set(registration.keys), name


# -- one registration adds a knob -----------------------------------------------------------------


class ToyKnob:
    name = "toy_knob"

    def __init__(self) -> None:
        self.value = 0.5

    def read(self) -> float:
        return self.value

    def apply(self, value: float) -> float:
        self.value = float(value)
        return self.read()


def _toy_policy() -> dict:
    return {"name": "toy", "controllers": [{"name": "hold", "probe": "perplexity", "knob": "toy_knob",
                                            "setpoint": 5.0, "kp": 0.1}]}


def test_a_toy_knob_needs_one_registration():
    with pytest.raises(PolicyError, match="unknown knob 'toy_knob'"):
        load_policy(_toy_policy())
    with pytest.raises(ConfigError, match="knobs.toy_knob: no setter"):
        setter_for("toy_knob")
    try:
        @knob_setter(Knob("toy_knob", 0.0, 1.0, "linear", 0.1, "a test's knob"), hint="ToyKnob()", needs_trainer=False)
        def _toy(**_):
            return ToyKnob()

        assert load_policy(_toy_policy()).controllers[0].knob == "toy_knob"
        setter = setter_for("toy_knob")
        assert isinstance(setter, ToyKnob) and setter.apply(0.25) == 0.25
        assert default_knob_spec("toy_knob", 0.5) == {"min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.1}
        assert disagreements(KNOBS, PROBES, registered_setters(), DOCS.read_text()) == [
            "knob toy_knob: missing from ['docs']"]
    finally:
        KNOBS.pop("toy_knob", None)
        _REGISTRY.pop("toy_knob", None)
    with pytest.raises(PolicyError, match="unknown knob 'toy_knob'"):
        load_policy(_toy_policy())
