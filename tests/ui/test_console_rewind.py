"""Issue 56 in the console, in a real headless Chromium against the real service: a rewind (a
rollback guardrail's firing) is drawn on the run's charts, a line at the breach and a band back to
the last step at which every guardrail held, and the page says which step keep-best keeps and why;
``actuator runs`` says the same."""

from __future__ import annotations

import httpx
from typer.testing import CliRunner

from actuator.cli import app
from test_console import severe, wait_for
from test_console_truth import _observe, _open, _row

POLICY = {"name": "rewind-ui",
          "guardrails": [{"name": "canary", "probe": "custom.canary", "bound": "upper", "threshold": 0.5,
                          "action": "rollback", "knob": "learning_rate", "factor": 0.5}],
          "rewind": {"healthy_saves": {"keep": 2}, "keep_best": {"probe": "custom.score", "mode": "max"}}}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-5, "max": 1e-2, "scale": "log", "max_step": 1.0}]


def _run_with_a_rewind(url: str) -> dict:
    """Readings 0-9: the canary breaches at step 5 (every guardrail last held at 4), the agent
    reports its saves and the best custom.score at step 3."""
    run = httpx.post(f"{url}/v1/runs", json={"policy": POLICY, "knobs": KNOBS}).json()
    kept = {"keep_best.step": 3.0, "keep_best.value": 0.75, "checkpoint.saves": 4.0,
            "checkpoint.save_seconds_total": 0.5}
    rewound = {"rewind.at_step": 6.0, "rewind.to_step": 3.0, "rewind.count": 1.0}  # the agent's checkpoint
    _observe(url, run, [{"seq": k, "step": k, "probes": {"custom.canary": 1.0 if k == 5 else 0.0,
                                                          "custom.score": 0.25 * min(k, 3)},
                         "metrics": {**(kept if k >= 3 else {}), **(rewound if k >= 7 else {})},
                         "knobs": {"learning_rate": 1e-3}} for k in range(10)])
    fired = [e for e in httpx.get(f"{url}/v1/runs/{run['id']}/events").json() if e["kind"] == "guardrail_breach"]
    assert [(e["step"], e["payload"]["action"], e["payload"]["healthy_step"]) for e in fired] == [(5, "rollback", 4)]
    return run


def _marks(browser, key: str) -> list[dict]:  # type: ignore[no-untyped-def]
    script = ("const b = document.querySelector(`[data-chart=\"${arguments[0]}\"]`);"
              "return b && b.dataset.rewinds ? JSON.parse(b.dataset.rewinds) : null")
    return wait_for(f"rewind marks on {key}", lambda: browser.execute_script(script, key), 10)


def _pixel(browser, key: str, x: int) -> list[int]:  # type: ignore[no-untyped-def]
    """The chart canvas's colour at canvas column ``x``, halfway down the plot."""
    script = ("const c = document.querySelector(`[data-chart=\"${arguments[0]}\"] canvas`);"
              "const g = c.getContext('2d');"
              "return Array.from(g.getImageData(arguments[1], Math.round(c.height / 2), 1, 1).data)")
    return browser.execute_script(script, key, x)


def test_the_run_page_marks_rewinds_and_says_which_step_is_kept(sqlite_service, browser) -> None:
    url = sqlite_service.url
    run = _run_with_a_rewind(url)
    browser.get_log("browser")
    _open(browser, url, run["id"])
    for key in ("probe:custom.canary", "probe:custom.score", "knob:learning_rate"):
        marks = _marks(browser, key)
        assert [(m["step"], m["to"]) for m in marks] == [(5, 4)], (key, marks)
        r, g, b, a = _pixel(browser, key, marks[0]["x"])
        assert (r, g, b) == (124, 58, 237) and a == 255, (key, r, g, b, a)  # the rewind's line is drawn there
    kept = _row(browser, "#kept")
    assert kept["step"] == "3", kept
    assert ("keep-best: step 3 kept: custom.score 0.75 there is the highest reading; kept on disk" in kept["text"]
            and "1 rewind (the last at step 6, back to the checkpoint of step 3)" in kept["text"]
            and "4 rewind/keep-best saves, 0.5 s in all" in kept["text"]), kept
    assert severe(browser.get_log("browser")) == []


def test_actuator_runs_says_which_step_is_kept_and_why(sqlite_service) -> None:
    url = sqlite_service.url
    run = _run_with_a_rewind(url)
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()
    assert state["kept"] == {"step": 3, "value": 0.75, "loaded": False, "saves": 4, "save_seconds": 0.5,
                             "probe": "custom.score", "mode": "max"}
    out = CliRunner().invoke(app, ["runs", "--url", url], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert (f"{run['id']}: keep-best: step 3 kept: custom.score 0.75 there is the highest reading; kept on disk "
            "(the model is the last step's, or training goes on); 4 rewind/keep-best saves, 0.5 s in all"
            in " ".join(out.output.split())), out.output
