"""Reports and tuning on hostile but accepted data, against the real service (SQLite).

A run name is free text (matplotlib reads ``$...$`` in it as mathtext), and probe, metric and
knob values of +-1e308 are finite, so ingest accepts them: every report (JSON, PNG, HTML) of
such a run answers 200. A tune on probe values near 1e300 answers 200 or a 4xx naming the
problem, never 500; a tune of a run longer than ACTUATOR_TUNE_OBSERVATIONS identifies from a
downsampled record and says so.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harden import post_obs, register
from actuator.testing import Service, make_service

CORPUS = Path(__file__).parent / "corpus"
BIG = 1e308
# Run names matplotlib's mathtext parser fails on (or hides: a leading underscore), plus markup.
HOSTILE_NAMES = [
    "$\\alpha$ \\frac{",
    "$",
    "$$",
    "costs $5 and $6",
    "\\frac{a}{b} $x^",
    "$\\undefinedcommand$",
    "a\\$b $c",
    "_leading underscore",
    "{}^_ %&# ~",
    "<script>alert(1)</script> $<b>$",
]
# The benign corpus's run names: stored verbatim, so they must be drawable too.
BENIGN_NAMES = [c["json"]["name"] for c in yaml.safe_load((CORPUS / "benign.yaml").read_text())["cases"]
                if isinstance(c.get("json", {}).get("name"), str)]

# Free probe and knob names (custom.*) carry no range: every finite value is accepted.
POLICY = {
    "name": "huge-values",
    "controllers": [{"name": "hold", "probe": "custom.score", "knob": "custom.w", "setpoint": BIG, "kp": 1.0}],
    "guardrails": [{"name": "floor", "probe": "custom.score", "bound": "lower", "threshold": -BIG,
                    "action": "alert"}],
}
KNOBS = [{"name": "custom.w", "value": 0.0, "min": -BIG, "max": BIG, "scale": "linear"},
         {"name": "learning_rate", "value": 1e-3, "min": 1e-300, "max": BIG, "scale": "log"}]


def _alternating(i: int) -> float:
    return BIG if i % 2 else -BIG


# Value patterns over 20 observations: each breaks an autoscaled axis in its own way.
PATTERNS = {
    "ordinary": lambda i: 0.1 + 0.01 * i,
    "alternating +-1e308": _alternating,
    "constant 1e308": lambda i: BIG,
    "constant -1e308": lambda i: -BIG,
    "1e308 then 1": lambda i: BIG if i < 10 else 1.0,
    "tiny and huge": lambda i: 1e-308 if i % 2 else BIG,
}


def _observations(pattern: str) -> list[dict[str, Any]]:
    value = PATTERNS[pattern]
    return [{"seq": i, "step": i * 10, "probes": {"custom.score": value(i), "custom.other": -value(i)},
             "metrics": {"loss": value(i + 1)},
             "knobs": {"custom.w": value(i), "learning_rate": 1e-300 if i % 2 else BIG}} for i in range(20)]


def _reports(url: str, run_id: str) -> dict[str, httpx.Response]:
    return {fmt: httpx.get(f"{url}/v1/runs/{run_id}/report", params={"format": fmt}, timeout=60)
            for fmt in ("json", "png", "html")}


# Each hostile name with ordinary values, each value pattern under a plain name, and both at once.
CASES = ([(name, "ordinary") for name in HOSTILE_NAMES + BENIGN_NAMES]
         + [("plain", pattern) for pattern in PATTERNS if pattern != "ordinary"]
         + [(HOSTILE_NAMES[0], "alternating +-1e308")])


@pytest.mark.parametrize("name,pattern", CASES, ids=[f"{n!r} {p}" for n, p in CASES])
def test_every_report_of_a_hostile_run_is_drawn(module_service: Service, name: str, pattern: str) -> None:
    run = register(module_service.url, policy=POLICY, knobs=KNOBS, name=name)
    r = post_obs(module_service.url, run, _observations(pattern))
    assert r.status_code == 200, r.text
    answers = _reports(module_service.url, run["id"])
    assert {fmt: a.status_code for fmt, a in answers.items()} == {"json": 200, "png": 200, "html": 200}, \
        {fmt: a.text[:300] for fmt, a in answers.items() if a.status_code != 200}
    assert answers["json"].json()["run"]["name"] == name
    assert answers["png"].content.startswith(b"\x89PNG")
    page = answers["html"].text
    assert "data:image/png;base64," in page and "<script>" not in page


# -- tuning -----------------------------------------------------------------------------------------
TUNE_POLICY = {"name": "tune-huge", "controllers": [{"name": "drift", "probe": "custom.score",
                                                     "knob": "learning_rate", "setpoint": 0.4, "kp": 1.0,
                                                     "ki": 0.2}]}
TUNE_KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-5, "max": 1e-2, "scale": "log", "max_step": 0.5}]


def recorded(scale: float, offset: float = 0.0, steps: int = 600, every: int = 10,
             seed: int = 0) -> list[dict[str, Any]]:
    """A FOPDT plant (gain 0.1 per ln(lr), tau 40, dead time 20) whose probe is stretched by ``scale``
    and shifted by ``offset``; the learning rate doubles at step 100."""
    rng = random.Random(seed)
    y, out, pipe = 0.3, [], [0.0] * 20
    for step in range(steps + 1):
        lr = 2e-3 if step >= 100 else 1e-3
        if step:
            pipe.append(math.log(lr / 1e-3))
            y += (0.3 + 0.1 * pipe.pop(0) - y) * (1 - math.exp(-1 / 40))
        if step % every == 0:
            value = offset + scale * (y + rng.gauss(0, 0.002))
            out.append({"seq": step // every, "step": step, "probes": {"custom.score": value},
                        "knobs": {"learning_rate": lr}})
    return out


def _tune(url: str, observations: list[dict[str, Any]]) -> httpx.Response:
    run = register(url, policy=TUNE_POLICY, knobs=TUNE_KNOBS, name="tune")
    assert post_obs(url, run, observations).status_code == 200
    return httpx.post(f"{url}/v1/policies/tune", json={"run_id": run["id"], "controller": "drift"}, timeout=120)


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _step_across_the_float_range() -> list[dict[str, Any]]:
    """-1e308 before the plant answers the learning rate's step, +1e308 after: a gain past the range."""
    return [{**o, "probes": {"custom.score": -BIG if o["step"] < 130 else BIG}} for o in recorded(1.0)]


HUGE_RECORDS = {
    "x1e300": lambda: recorded(1e300),
    "x-1e300": lambda: recorded(-1e300),
    "x1e307": lambda: recorded(1e307),
    "+1e300": lambda: recorded(1.0, 1e300),  # the response is below the resolution of floats near 1e300
    "x1e300-1e308": lambda: recorded(1e300, -BIG),
    "-1e308 to 1e308": _step_across_the_float_range,
}


@pytest.mark.parametrize("record", HUGE_RECORDS)
def test_tune_on_values_near_1e300_answers_200_or_names_the_problem(module_service: Service, record: str) -> None:
    r = _tune(module_service.url, HUGE_RECORDS[record]())
    assert r.status_code != 500, r.text[:2000]
    if r.status_code == 200:
        body = r.json()
        assert _finite(body)
        assert body["model"]["gain"] != 0 and body["gains"]["kp"] > 0
    else:
        assert 400 <= r.status_code < 500
        detail = r.json()["detail"]
        assert detail["message"].startswith("run_id: "), detail
        assert detail["errors"][0]["loc"] == "body.run_id", detail


def test_a_tune_that_fits_is_unchanged_by_the_scale_of_its_probe(module_service: Service) -> None:
    """The fit works on the probe scaled by a power of two: the model found on values near 1e300
    is the model found on the same values near 1, in proportion."""
    small, huge = (_tune(module_service.url, recorded(scale)) for scale in (1.0, 2.0 ** 996))
    assert small.status_code == 200 and huge.status_code == 200, (small.text[:500], huge.text[:500])
    a, b = small.json()["model"], huge.json()["model"]
    assert (a["kind"], a["tau"], a["theta"]) == (b["kind"], b["tau"], b["theta"])
    assert b["gain"] == pytest.approx(a["gain"] * 2.0 ** 996, rel=1e-9)
    assert b["r2"] == pytest.approx(a["r2"], rel=1e-9)


def test_a_long_run_is_tuned_from_a_downsampled_record(tmp_path: Path) -> None:
    limit = 150
    service = make_service(f"sqlite:///{tmp_path / 'actuator.db'}", log_dir=str(tmp_path),
                           extra_env={"ACTUATOR_TUNE_OBSERVATIONS": str(limit)}).start()
    try:
        observations = recorded(1.0, steps=6000, every=10)  # 601 observations
        run = register(service.url, policy=TUNE_POLICY, knobs=TUNE_KNOBS, name="long")
        assert post_obs(service.url, run, observations).status_code == 200
        r = httpx.post(f"{service.url}/v1/policies/tune", json={"run_id": run["id"], "controller": "drift"},
                       timeout=120)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["observations_total"] == len(observations)
        assert body["observations_used"] <= limit
        assert any("ACTUATOR_TUNE_OBSERVATIONS" in w for w in body["warnings"]), body["warnings"]
        assert body["model"]["gain"] == pytest.approx(0.1, rel=0.3)
    finally:
        service.stop()
