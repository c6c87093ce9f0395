"""rl_kl's Actuator arm with issue 40's laws (``--predict``, ``--ramp``) as the real service stores it:
the flags reach the PID on log β as ``horizon`` and ``setpoint_ramp`` (how the service then decides
with them: ``tests/api/test_predictive_api.py``)."""

from __future__ import annotations

import httpx
import pytest

from benchmarks.control.rl_kl import parser, pid_policy


def args(*argv: str):
    return parser().parse_args(list(argv))


def register(url: str, name: str, policy: dict, beta: float = 0.5) -> dict:
    r = httpx.post(f"{url}/v1/runs", json={"name": name, "policy": policy, "knobs": [
        {"name": "kl_beta", "value": beta, "scale": "log", "min": beta / 10, "max": beta * 10, "max_step": 1.0}]})
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.parametrize("flags, horizon, ramp", [((), 0, 0), (("--predict", "2"), 2, 0),
                                                  (("--ramp", "3"), 0, 3), (("--predict", "2", "--ramp", "3"), 2, 3)])
def test_the_flags_reach_the_stored_controller(flags, horizon, ramp, sqlite_service) -> None:
    run = register(sqlite_service.url, f"rl-{len(flags)}", pid_policy(args(*flags)))
    (c,) = run["policy"]["controllers"]
    assert c["knob"] == "kl_beta" and c["direction"] == "reverse"
    assert (c.get("horizon") or 0) == horizon
    assert (c.get("setpoint_ramp") or 0) == ramp

