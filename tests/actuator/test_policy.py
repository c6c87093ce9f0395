"""Policy documents: every validation error names its field; presets and the one-line form."""

from __future__ import annotations

import json

import pytest

from actuator import PolicyError
from actuator.policy import list_presets, load_policy, load_preset, protect_policy, setpoint_at

CTRL = {"name": "c", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1, "kp": 1.0}


def errors_of(doc) -> dict[str, str]:
    with pytest.raises(PolicyError) as exc:
        load_policy(doc)
    return {e["loc"]: e["msg"] for e in exc.value.errors}


@pytest.mark.parametrize("patch,loc,needle", [
    ({"min": 1e-3, "max": 1e-5}, "controllers.0.max", "greater than max"),
    ({"probe": "vibes"}, "controllers.0.probe", "unknown probe"),
    ({"knob": "warp_speed"}, "controllers.0.knob", "unknown knob"),
    ({"kp": -1.0}, "controllers.0.kp", "greater than or equal to 0"),
    ({"ki": -0.1}, "controllers.0.ki", "greater than or equal to 0"),
    ({"setpoint": -0.5}, "controllers.0", "outside the range of kl_drift"),
    ({"probe": "hotpotqa.em", "setpoint": 1.5}, "controllers.0", "outside the range of hotpotqa.em"),
    ({"setpoint": [[10, 0.1], [5, 0.2]]}, "controllers.0.setpoint", "strictly increasing"),
    ({"setpoint": "10 percent"}, "controllers.0.setpoint", "relative setpoint"),
    ({"kp": float("nan")}, "controllers.0.kp", "finite"),
    ({"filter": {"kind": "ema", "alpha": 0}}, "controllers.0.filter.alpha", "greater than 0"),
    ({"cooldown": -1}, "controllers.0.cooldown", "greater than or equal to 0"),
    ({"bogus": 1}, "controllers.0.bogus", "Extra inputs"),
])
def test_controller_errors_name_the_field(patch, loc, needle):
    errs = errors_of({"name": "p", "controllers": [{**CTRL, **patch}]})
    assert loc in errs, errs
    assert needle in errs[loc], errs


def test_every_error_is_reported_at_once():
    errs = errors_of({"name": "p", "controllers": [{**CTRL, "kp": -1, "min": 1.0, "max": 0.1, "knob": "x"}],
                      "guardrails": [{"name": "g", "probe": "kl_drift", "bound": "sideways", "threshold": 1}]})
    assert {"controllers.0.kp", "controllers.0.max", "controllers.0.knob", "guardrails.0.bound"} <= set(errs)


@pytest.mark.parametrize("guard,loc,needle", [
    ({"action": "adjust"}, "guardrails.0", "needs 'knob'"),
    ({"threshold": "5%"}, "guardrails.0.threshold", "'-5%'"),
    ({"threshold": -1.0}, "guardrails.0", "outside the range"),
    ({"consecutive": 0}, "guardrails.0.consecutive", "greater than or equal to 1"),
    ({"action": "explode"}, "guardrails.0.action", "alert"),
])
def test_guardrail_errors_name_the_field(guard, loc, needle):
    base = {"name": "g", "probe": "kl_drift", "bound": "upper", "threshold": 0.5}
    errs = errors_of({"name": "p", "guardrails": [{**base, **guard}]})
    assert loc in errs and needle in errs[loc], errs


def test_duplicate_names_and_bad_documents():
    errs = errors_of({"name": "p", "controllers": [CTRL, CTRL]})
    assert any("repeated" in m for m in errs.values())
    with pytest.raises(PolicyError, match="mapping"):
        load_policy("- just\n- a list\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy("name: [unclosed\n")
    with pytest.raises(PolicyError, match="not found"):
        load_policy("/no/such/policy.yaml")


def test_yaml_json_and_file_forms_agree(tmp_path):
    doc = {"name": "p", "controllers": [CTRL]}
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ncontrollers:\n  - {name: c, probe: kl_drift, knob: learning_rate, setpoint: 0.1, kp: 1.0}\n")
    assert load_policy(doc) == load_policy(json.dumps(doc)) == load_policy(path) == load_policy(str(path))


def test_setpoint_schedules():
    assert setpoint_at(0.3, 100) == 0.3
    pts = [(0, 0.0), (100, 1.0)]
    assert setpoint_at(pts, -5) == 0.0 and setpoint_at(pts, 50) == pytest.approx(0.5) and setpoint_at(pts, 500) == 1.0
    assert setpoint_at("+10%", 0, baseline=20.0) == pytest.approx(22.0)
    assert setpoint_at("-5%", 0, baseline=-2.0) == pytest.approx(-2.1)


def test_presets_load_and_cover_the_four_tasks():
    assert set(list_presets()) == {"sft-capability", "dpo-kl", "rl-kl", "draft-distill", "compress-ppl",
                                   "compress-threshold", "compress-width", "protect-capability", "rl-kl-fast",
                                   "rl-entropy"}
    knobs = {load_preset(n).controllers[0].knob for n in list_presets()}
    assert knobs == {"learning_rate", "kl_beta", "distill_lambda", "rank", "compression_threshold",
                     "mlp_channel_threshold", "kl_weight", "entropy_coef"}
    assert load_preset("rl-kl").controllers[0].direction == "reverse"
    # DPO: the learning rate (direct: a higher rate drifts faster) and the KL-anchor weight
    # (a constraint, reverse: more weight, less KL); beta alone cannot hold DPO's KL.
    anchor, lr = load_preset("dpo-kl").controllers
    assert (anchor.knob, anchor.kind, anchor.direction) == ("kl_weight", "constraint", "reverse")
    assert (lr.knob, lr.kind, lr.direction) == ("learning_rate", "setpoint", "direct")
    # A higher threshold cuts more components, so perplexity rises with the knob: direct acting.
    assert load_preset("compress-threshold").controllers[0].direction == "direct"
    assert load_preset("compress-width").controllers[0].direction == "direct"
    protect = load_preset("protect-capability").controllers[0]
    assert (protect.kind, protect.bound, protect.direction) == ("constraint", "upper", "reverse")


def test_constraint_controllers_are_multipliers():
    doc = {"name": "c", "controllers": [{"name": "k", "kind": "constraint", "probe": "kl_drift", "knob": "kl_weight",
                                         "setpoint": 0.5, "kp": 1.0, "direction": "direct"}]}
    # the direction follows from the bound: a restoring force pushes the probe back inside
    assert load_policy(doc).controllers[0].direction == "reverse"
    doc["controllers"][0]["bound"] = "lower"
    assert load_policy(doc).controllers[0].direction == "direct"
    for bad, field in (({"scale": "log"}, "multiplier on a linear scale"), ({"min": -0.5}, "is negative")):
        broken = {**doc, "controllers": [{**doc["controllers"][0], **bad}]}
        with pytest.raises(PolicyError, match=field):
            load_policy(broken)


def test_protect_one_liner_holds_absolute_budgets_with_the_anchor():
    doc = protect_policy({"kl_drift": 0.5, "hotpotqa.gold_logprob": "-5%"}, anchor=True)
    (c,) = doc.controllers
    assert (c.kind, c.knob, c.probe, c.setpoint) == ("constraint", "kl_weight", "kl_drift", 0.5)
    actions = {g.probe: g.action for g in doc.guardrails}
    assert actions == {"kl_drift": "alert", "hotpotqa.gold_logprob": "rollback"}
    assert not protect_policy({"kl_drift": 0.5}).controllers  # without an anchor: guardrails only
    # answer_kl (KL where the start's answers begin) is a drift probe: an upper budget, read every 10 steps
    (a,) = protect_policy({"answer_kl": 0.1}, anchor=True).controllers
    assert (a.probe, a.bound, a.setpoint) == ("answer_kl", "upper", 0.1)
    with pytest.raises(PolicyError, match="answer_kl"):
        protect_policy({"answer_kl": -0.1}, anchor=True)  # a KL is never below 0: a budget it cannot meet
    with pytest.raises(PolicyError, match="no preset"):
        load_preset("nope")


def test_protect_one_liner():
    doc = protect_policy({"hotpotqa.gold_logprob": "-5%", "kl_drift": 0.1}, on_drift="adjust", on_breach="rollback")
    g = {x.probe: x for x in doc.guardrails}
    assert g["hotpotqa.gold_logprob"].bound == "lower" and g["hotpotqa.gold_logprob"].action == "rollback"
    assert g["hotpotqa.gold_logprob"].resolve_threshold(-2.0) == pytest.approx(-2.1)
    assert g["kl_drift"].bound == "upper" and g["kl_drift"].action == "adjust" and g["kl_drift"].knob == "learning_rate"
    assert {p.name for p in doc.probes} == {"hotpotqa", "kl_drift"}
    assert protect_policy({"kl_drift": 0.1}).name == protect_policy({"kl_drift": 0.1}).name  # stable name
    with pytest.raises(PolicyError):
        protect_policy({})


def test_setpoint_weight_is_a_setpoint_controllers_and_defaults_to_the_bumpless_start():
    base = {"name": "c", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1, "kp": 1.0}
    assert load_policy({"name": "p", "controllers": [base]}).controllers[0].setpoint_weight == 0.0
    assert load_policy({"name": "p", "controllers": [{**base, "setpoint_weight": 1}]}).controllers[0].setpoint_weight == 1
    with pytest.raises(PolicyError, match="setpoint_weight"):
        load_policy({"name": "p", "controllers": [{**base, "setpoint_weight": 1.5}]})
    with pytest.raises(PolicyError, match="setpoint_weight"):
        load_policy({"name": "p", "controllers": [{**base, "knob": "kl_weight", "kind": "constraint",
                                                   "setpoint_weight": 1}]})


MAXIMIZE = {"name": "m", "kind": "maximize", "probe": "draft.acceptance", "knob": "onpolicy_fraction",
            "dither": 0.1, "gain": 0.5}


def test_each_kind_is_its_own_model_and_controller_spec_dispatches_on_kind():
    from actuator.policy import ConstraintController, ControllerSpec, MaximizeController, SetpointController

    budget = {**CTRL, "name": "b", "kind": "constraint", "knob": "kl_weight"}
    doc = load_policy({"name": "p", "controllers": [CTRL, budget, MAXIMIZE]})
    assert [type(c) for c in doc.controllers] == [SetpointController, ConstraintController, MaximizeController]
    for data, model in ((CTRL, SetpointController), (budget, ConstraintController), (MAXIMIZE, MaximizeController)):
        assert type(ControllerSpec.model_validate(data)) is model
    assert "dither" not in SetpointController.model_fields and "setpoint_weight" not in ConstraintController.model_fields
    assert not {"setpoint", "kp", "ki", "kd", "direction", "gains"} & set(MaximizeController.model_fields)
    # another kind's field reads as its unused value, and documents keep every field in one order
    assert (doc.controllers[2].setpoint, doc.controllers[2].kp, doc.controllers[0].cost) == (None, None, None)
    setpoint, constraint, maximize = (c.model_dump(mode="json") for c in doc.controllers)
    assert list(setpoint) == list(constraint) == list(maximize)
    assert (setpoint["dither"], constraint["setpoint_weight"], maximize["kp"], maximize["gains"]) == (
        None, 0.0, None, "absolute")
    assert load_policy(doc.model_dump(mode="json")) == doc


def test_a_document_with_every_field_on_every_controller_still_loads():
    # what policies stored before the kinds were separate hold: each controller with every field,
    # another kind's at its unused value
    unused = {"bound": "upper", "setpoint": None, "kp": None, "ki": 0.0, "kd": 0.0, "direction": "direct",
              "deadband": 0.0, "setpoint_weight": 0.0, "cooldown": 0, "dither": None, "gain": None,
              "smoothing": 0.5, "cost": None, "cost_weight": 0.0}
    new = load_policy({"name": "p", "controllers": [CTRL, MAXIMIZE]})
    old = load_policy({"name": "p", "controllers": [{**unused, **CTRL}, {**unused, **MAXIMIZE}]})
    assert old == new


@pytest.mark.parametrize("controller,loc,needle", [
    ({**CTRL, "kind": "bogus"}, "controllers.0.kind", "Input should be 'setpoint', 'constraint', 'maximize', 'follow' or 'split_range'"),
    ({**CTRL, "dither": 0.1}, "controllers.0.dither", "only a maximize controller has dither (this one is kind "
                                                       "setpoint)"),
    ({**CTRL, "dither": -0.1}, "controllers.0.dither", "greater than 0"),
    ({**CTRL, "kind": "constraint", "knob": "kl_weight", "min": -1.0}, "controllers.0", "is negative"),
    ({**MAXIMIZE, "kp": 1.0}, "controllers.0.kp", "a maximize controller has no kp"),
    ({**MAXIMIZE, "smoothing": 0.0}, "controllers.0.smoothing", "greater than 0"),
    ({**MAXIMIZE, "setpoint": [[5, 0.3], [1, 0.2]]}, "controllers.0.setpoint", "has no setpoint"),
])
def test_errors_of_every_kind_name_the_documents_field(controller, loc, needle):
    errs = errors_of({"name": "p", "controllers": [controller]})
    assert loc in errs and needle in errs[loc], errs


def test_the_schema_shows_every_field_of_every_kind():
    from actuator.policy import ControllerSpec, PolicyDocument, _KINDS

    schema = PolicyDocument.model_json_schema()
    items = schema["properties"]["controllers"]["items"]["oneOf"]
    assert [i["$ref"].rsplit("/", 1)[1] for i in items] == ["SetpointController", "ConstraintController",
                                                            "MaximizeController", "FollowController",
                                                            "SplitRangeController"]
    for model in _KINDS.values():
        props = schema["$defs"][model.__name__]["properties"]
        assert set(props) == set(model.model_fields) >= set(ControllerSpec.model_fields)
    assert "gains" in schema["$defs"]["SetpointController"]["properties"]


# -- kind: follow (issue 41): the knob follows the probe through a monotone schedule ------------------

FOLLOW = {"name": "mix", "kind": "follow", "probe": "draft.acceptance", "knob": "divergence_mix",
          "schedule": [[0.2, 0.0], [0.4, 0.5], [0.6, 1.0]], "max_step": 0.1, "filter": {"kind": "ema", "alpha": 0.3}}


def test_a_follow_controller_loads_keeps_its_schedule_and_round_trips():
    from actuator.policy import FollowController

    doc = load_policy({"name": "p", "controllers": [CTRL, FOLLOW]})
    follow = doc.controllers[1]
    assert type(follow) is FollowController
    assert follow.schedule == [(0.2, 0.0), (0.4, 0.5), (0.6, 1.0)]
    assert (follow.setpoint, follow.kp, follow.dither) == (None, None, None)  # other kinds' fields: unused
    assert load_policy(doc.model_dump(mode="json")) == doc
    # the documents of the kinds before it keep their shape: no schedule field
    assert "schedule" not in doc.controllers[0].model_dump(mode="json")
    assert doc.controllers[1].model_dump(mode="json")["schedule"] == [[0.2, 0.0], [0.4, 0.5], [0.6, 1.0]]
    # a falling schedule is monotone too (a temperature that drops as acceptance rises)
    falling = {**FOLLOW, "knob": "distill_temperature", "schedule": [[0.2, 4.0], [0.6, 1.0]]}
    assert load_policy({"name": "p", "controllers": [falling]}).controllers[0].schedule[1] == (0.6, 1.0)


@pytest.mark.parametrize("patch,needle", [
    ({"schedule": [[0.2, 0.0]]}, "at least 2 points"),
    ({"schedule": []}, "at least 2 points"),
    ({"schedule": [[0.4, 0.0], [0.2, 0.5]]}, "strictly increasing (sorted)"),
    ({"schedule": [[0.2, 0.0], [0.2, 0.5]]}, "strictly increasing"),
    ({"schedule": [[0.2, 0.0], [0.4, 0.8], [0.6, 0.5]]}, "must be monotone"),
    ({"schedule": [[0.2, 0.0], [0.6, 1.5]]}, "outside the bounds of divergence_mix [0, 1]"),
    ({"schedule": [[0.2, -0.1], [0.6, 1.0]]}, "outside the bounds of divergence_mix [0, 1]"),
    ({"schedule": [[0.2, 0.0], [1.5, 1.0]]}, "outside the range of draft.acceptance"),
    ({"schedule": [[0.2, 0.0], [0.6, 1.0]], "max": 0.5}, "outside the controller's min/max [-inf, 0.5]"),
    ({"schedule": [[0.2, 0.0], [0.6, float("nan")]]}, "finite"),
    ({"schedule": None}, "a follow controller needs schedule"),
])
def test_a_bad_schedule_is_refused_naming_the_schedule(patch, needle):
    errs = errors_of({"name": "p", "controllers": [{**FOLLOW, **patch}]})
    where = [loc for loc in errs if loc.startswith("controllers.0.schedule")]
    assert where and needle in errs[where[0]], errs


@pytest.mark.parametrize("controller,loc,needle", [
    ({**FOLLOW, "kp": 1.0}, "controllers.0.kp", "a follow controller has no kp"),
    ({**FOLLOW, "setpoint": 0.5}, "controllers.0.setpoint", "a follow controller has no setpoint"),
    ({**FOLLOW, "dither": 0.1}, "controllers.0.dither", "only a maximize controller has dither"),
    ({**FOLLOW, "direction": "reverse"}, "controllers.0.direction", "its schedule's"),
    ({**CTRL, "schedule": [[0.0, 1.0], [1.0, 2.0]]}, "controllers.0.schedule", "only a follow controller has "
                                                                                "schedule (this one is kind setpoint)"),
    ({**MAXIMIZE, "schedule": [[0.0, 0.1], [1.0, 0.2]]}, "controllers.0.schedule", "only a follow controller"),
])
def test_fields_of_other_kinds_on_a_follow_controller_and_its_schedule_elsewhere_are_refused(controller, loc, needle):
    errs = errors_of({"name": "p", "controllers": [controller]})
    assert loc in errs and needle in errs[loc], errs


# -- issue 40: horizon, setpoint_ramp and kind: split_range ------------------------------------------

SPLIT = {"name": "kl", "kind": "split_range", "probe": "kl_drift", "setpoint": 0.1, "gains": "relative", "kp": 0.5,
         "ki": 0.3, "horizon": 2,
         "legs": [{"knob": "learning_rate", "range": [0, 1], "values": [1e-6, 5e-5], "acts": "direct"},
                  {"knob": "kl_weight", "range": [-1, 0], "values": [2.0, 0.0], "acts": "reverse"}]}


def test_horizon_and_setpoint_ramp_load_and_are_left_out_of_documents_without_them():
    doc = load_policy({"name": "p", "controllers": [{**CTRL, "horizon": 2, "setpoint_ramp": 8}, CTRL | {"name": "b"}]})
    with_them, without = doc.model_dump(mode="json")["controllers"]
    assert (with_them["horizon"], with_them["setpoint_ramp"]) == (2.0, 8.0)
    assert "horizon" not in without and "setpoint_ramp" not in without
    assert without == load_policy({"name": "p", "controllers": [CTRL | {"name": "b"}]}).model_dump(mode="json")["controllers"][0]
    assert load_policy(doc.model_dump(mode="json")) == doc
    # the other kinds' documents keep their shape too
    follow = load_policy({"name": "p", "controllers": [FOLLOW]}).model_dump(mode="json")["controllers"][0]
    assert not {"horizon", "setpoint_ramp", "legs"} & set(follow)


@pytest.mark.parametrize("controller, loc, needle", [
    ({**CTRL, "horizon": -1}, "controllers.0.horizon", "greater than or equal to 0"),
    ({**CTRL, "horizon": 101}, "controllers.0.horizon", "less than or equal to 100"),
    ({**CTRL, "setpoint_ramp": 10001}, "controllers.0.setpoint_ramp", "less than or equal to 10000"),
    ({"name": "c", "kind": "constraint", "probe": "kl_drift", "knob": "kl_weight", "setpoint": 0.1, "kp": 1,
      "setpoint_ramp": 4}, "controllers.0.setpoint_ramp", "holds its budget from the start"),
    ({**FOLLOW, "horizon": 2}, "controllers.0.horizon", "does not use horizon"),
    ({**SPLIT, "legs": SPLIT["legs"][:1]}, "controllers.0.legs", "two knobs"),
    ({**SPLIT, "legs": [SPLIT["legs"][0], {**SPLIT["legs"][1], "range": [-1, 0.5]}]}, "controllers.0.legs",
     "the ranges overlap"),
    ({**SPLIT, "legs": [SPLIT["legs"][0], {**SPLIT["legs"][1], "range": [0, 2]}]}, "controllers.0.legs.1.range",
     "-1 <= lo < hi <= 1"),
    ({**SPLIT, "legs": [SPLIT["legs"][0], {**SPLIT["legs"][1], "values": [0.0, 2.0]}]}, "controllers.0.legs.1",
     "lowers the measurement as the output rises"),
    ({**SPLIT, "legs": [{**SPLIT["legs"][0], "values": [0.0, 5e-5]}, SPLIT["legs"][1]]},
     "controllers.0.legs.0.values", "log-scale knob's ends must be > 0"),
    ({**SPLIT, "legs": [{**SPLIT["legs"][0], "knob": "kl_weight"}, SPLIT["legs"][1]]},
     "controllers.0.legs.1.knob", "the same knob"),
    ({**SPLIT, "knob": "kl_weight"}, "controllers.0.knob", "names its knobs in legs"),
    ({**SPLIT, "gains": "auto"}, "controllers.0.gains", "step test identifies one knob"),
    ({**SPLIT, "max": 1.0}, "controllers.0.max", "does not apply"),
    ({k: v for k, v in SPLIT.items() if k != "legs"}, "controllers.0.legs", "needs legs"),
    ({**CTRL, "legs": SPLIT["legs"]}, "controllers.0.legs", "only a split_range controller has legs"),
])
def test_new_fields_and_split_range_errors_name_the_field(controller, loc, needle):
    errs = errors_of({"name": "p", "controllers": [controller]})
    assert loc in errs and needle in errs[loc], errs


def test_a_split_range_controller_loads_round_trips_and_has_no_knob_of_its_own():
    from actuator.policy import SplitRangeController

    doc = load_policy({"name": "p", "controllers": [SPLIT]})
    c = doc.controllers[0]
    assert type(c) is SplitRangeController and c.driven() == ["learning_rate", "kl_weight"]
    dumped = doc.model_dump(mode="json")["controllers"][0]
    assert "knob" not in dumped and dumped["legs"][1] == {"knob": "kl_weight", "range": [-1.0, 0.0],
                                                          "values": [2.0, 0.0], "acts": "reverse"}
    assert load_policy(doc.model_dump(mode="json")) == doc
    assert load_policy({"name": "p", "controllers": [CTRL]}).controllers[0].driven() == [CTRL["knob"]]


def test_policy_validate_shows_auto_gains_fallback_in_both_forms(tmp_path):
    from typer.testing import CliRunner

    from actuator.cli import app

    path = tmp_path / "auto.yaml"
    path.write_text("name: p\ncontrollers:\n  - {name: c, probe: kl_drift, knob: learning_rate, setpoint: 0.1, "
                    "gains: auto, kp: 0.5}\n")
    out = CliRunner().invoke(app, ["policy", "validate", str(path)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "c: auto gains, fallback (relative) kp 0.5 per unit of |setpoint| 0.1 = kp 5 per kl_drift unit" in \
        out.output, out.output
