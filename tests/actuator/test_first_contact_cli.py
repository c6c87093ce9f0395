"""Issue 36, the CLI a new user meets first, against a real service: full run ids at 80 columns,
starved probes in `actuator runs`, a run named by an id prefix or its name (an ambiguous or
unknown one answered with the candidates), presets shown and validated, reasons and --explain
saying which P/I/D they show, and error text printed as it is."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import actuator.policy
from actuator.cli import app
from actuator.policy import PolicyError, list_presets, load_policy

sys.path.insert(0, str(Path(__file__).parent.parent / "hardening"))
from harden import post_obs, register  # noqa: E402

POLICY = {"name": "first-contact-cli", "controllers": [{"name": "drift", "probe": "kl_drift",
                                                        "knob": "learning_rate", "setpoint": 0.1, "kp": 1.0,
                                                        "ki": 0.2}]}
PRESETS = Path(actuator.policy.__file__).parent / "presets"


def cli(*args: str, columns: int = 200):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(columns)})


KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]  # no rate limit


def _decide(url: str, run: dict) -> None:
    """Two decisions on ``run``: drift far above its setpoint, twice."""
    for seq, drift in enumerate([0.1, 0.4, 0.9]):
        r = post_obs(url, run, [{"seq": seq, "step": 10 * (seq + 1), "probes": {"kl_drift": drift}}])
        assert r.status_code == 200, r.text


def test_runs_shows_whole_ids_at_80_columns_and_the_starved_probes(sqlite_service):
    url = sqlite_service.url
    calm = register(url, policy=POLICY, name="a-rather-long-run-name-from-a-script")
    hungry = register(url, policy=POLICY, name="grpo")
    r = post_obs(url, hungry, [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.1},
                                "metrics": {"probe_share": 0.9, "probe_starved.policy_kl": 3.0}}])
    assert r.status_code == 200, r.text
    out = cli("runs", "--url", url, columns=80)
    assert out.exit_code == 0, out.output
    assert calm["id"] in out.output and hungry["id"] in out.output, out.output
    rows = {run["id"]: next(line.split() for line in out.output.splitlines() if line.split()[:1] == [run["id"]])
            for run in (calm, hungry)}
    assert rows[hungry["id"]][2] == "running*" and rows[calm["id"]][2] == "running"  # the marker, on its run
    (note,) = [line for line in out.output.splitlines() if line.startswith("*")]  # and what it means, whole
    assert hungry["id"] in note and "starved" in note and note.endswith(": policy_kl")


def test_commands_take_an_id_prefix_or_the_run_name(sqlite_service):
    url = sqlite_service.url
    alpha = register(url, policy=POLICY, name="alpha")
    _decide(url, alpha)
    twins = [register(url, policy=POLICY, name="twin") for _ in range(2)]

    by_prefix = cli("decisions", alpha["id"][:8], "--url", url)
    assert by_prefix.exit_code == 0, by_prefix.output
    assert "2 decisions" in by_prefix.output and "learning_rate" in by_prefix.output
    by_name = cli("decisions", "alpha", "--url", url)
    assert by_name.exit_code == 0 and by_name.output == by_prefix.output

    ambiguous = cli("decisions", "twin", "--url", url)
    assert ambiguous.exit_code == 1
    assert "twin" in ambiguous.output and all(t["id"] in ambiguous.output for t in twins), ambiguous.output
    # The same for tune, before anything is fitted.
    tune = cli("policy", "tune", "--run", "twin", "--controller", "drift", "--url", url)
    assert tune.exit_code == 1 and all(t["id"] in tune.output for t in twins), tune.output

    unknown = cli("decisions", "no-such-run", "--url", url)
    assert unknown.exit_code == 1
    assert "no-such-run" in unknown.output and alpha["id"] in unknown.output, unknown.output  # the runs there are

    # Two ids sharing their first characters: that prefix names neither, and both are listed.
    ids = [alpha["id"], *(t["id"] for t in twins)]
    while len({i[0] for i in ids}) == len(ids):
        ids.append(register(url, policy=POLICY, name="more")["id"])
    shared = next(c for c in {i[0] for i in ids} if sum(i[0] == c for i in ids) > 1)
    clash = cli("decisions", shared, "--url", url)
    assert clash.exit_code == 1
    assert all(i in clash.output for i in ids if i[0] == shared), clash.output


def test_reason_shows_this_decision_moves_and_explain_shows_the_levels(sqlite_service):
    url = sqlite_service.url
    run = register(url, policy=POLICY, name="explained", knobs=KNOBS)
    _decide(url, run)
    items = httpx.get(f"{url}/v1/runs/{run['id']}/decisions").json()["items"]
    assert len(items) == 2
    first, second = items
    moves = dict(re.findall(r"Δ([PID]) ([+-][0-9.e+-]+)", second["reason"]))
    assert set(moves) >= {"P", "I"}, second["reason"]
    # The moves are this decision's: the change of each term since the previous update.
    for term in moves:
        k = term.lower()
        assert float(moves[term]) == pytest.approx(second["components"][k] - first["components"][k], rel=1e-2)
    out = cli("decisions", run["id"], "--explain", "--url", url)
    assert out.exit_code == 0, out.output
    levels = re.findall(r"levels after this decision: P ([+-][0-9.e+-]+) +I ([+-][0-9.e+-]+)", out.output)
    assert [(float(p), float(i)) for p, i in levels] == [
        (pytest.approx(d["components"]["p"], rel=1e-3), pytest.approx(d["components"]["i"], rel=1e-3))
        for d in items]


def test_policy_show_prints_a_preset_as_shipped_and_a_stored_policy(sqlite_service):
    for name in list_presets():
        out = cli("policy", "show", f"preset:{name}", columns=40)
        assert out.exit_code == 0, out.output
        assert out.output == (PRESETS / f"{name}.yaml").read_text()  # comments and all, never wrapped
    missing = cli("policy", "show", "preset:no-such-preset")
    assert missing.exit_code == 1 and "sft-capability" in missing.output

    url = sqlite_service.url
    register(url, policy=POLICY)
    out = cli("policy", "show", "first-contact-cli", "--url", url)
    assert out.exit_code == 0, out.output
    assert load_policy(out.output).model_dump() == load_policy(POLICY).model_dump()


def test_policy_validate_takes_a_preset():
    for name in list_presets():
        out = cli("policy", "validate", f"preset:{name}")
        assert out.exit_code == 0, out.output
        assert "valid" in out.output
    out = cli("policy", "validate", "preset:no-such-preset")
    assert out.exit_code == 1 and "no-such-preset" in out.output


def test_policy_errors_are_printed_verbatim(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: p\nprobes: [a, b: c: d]\n")
    with pytest.raises(PolicyError) as err:
        load_policy(bad)
    out = cli("policy", "validate", str(bad))
    assert out.exit_code == 1
    assert str(err.value) in out.output, out.output
