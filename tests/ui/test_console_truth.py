"""The console tells what happened (issue 57), in a real headless Chromium against the real
service: charts fit their data (y from the readings and the knob's bounds, x covering every
decision and event), a controller's ramped setpoint is drawn and explained, the starved banner
counts the readings a controller really got, breach counts equal the stored events, and a halted
run's controller reading is shown with its (older) step."""

from __future__ import annotations

import httpx

from actuator.policy import load_preset
from test_console import severe, wait_for


def _observe(url: str, run: dict, observations: list[dict]) -> None:
    auth = {"Authorization": f"Bearer {run['token']}"}
    r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json={"observations": observations})
    assert r.status_code == 200, r.text


def _open(browser, url: str, run_id: str) -> None:  # type: ignore[no-untyped-def]
    browser.get(f"{url}/ui/runs/{run_id}")
    wait_for("the run page", lambda: browser.execute_script("return document.body.dataset.ready === '1'"), 15)


def _chart(browser, key: str) -> dict:  # type: ignore[no-untyped-def]
    """The chart's ranges and caption once it is drawn (the page redraws 100 ms after a change)."""
    script = ("const b = document.querySelector(`[data-chart=\"${arguments[0]}\"]`);"
              "return b && b.dataset.yMax !== undefined && b.querySelector('.uplot') ? "
              "{...b.dataset, title: b.querySelector('h3').textContent} : null")
    return wait_for(f"chart {key}", lambda: browser.execute_script(script, key), 10)


def _row(browser, selector: str) -> dict:  # type: ignore[no-untyped-def]
    """An element's text and data, read in one script call (the page replaces its rows as it refreshes)."""
    script = ("const e = document.querySelector(arguments[0]);"
              "return e && e.innerText ? {...e.dataset, text: e.innerText} : null")
    return wait_for(selector, lambda: browser.execute_script(script, selector), 10)


def test_grpo_charts_fit_a_tiny_kl_and_a_decision_after_the_last_reading(sqlite_service, browser) -> None:
    url = sqlite_service.url
    knobs = [{"name": "kl_beta", "value": 0.04, "min": 0.0004, "max": 0.4, "scale": "log", "max_step": 0.7}]
    run = httpx.post(f"{url}/v1/runs", json={"policy": load_preset("rl-kl").model_dump(mode="json"),
                                              "knobs": knobs}).json()
    _observe(url, run, [{"seq": k, "step": k, "probes": {"policy_kl": 0.0001 * (k + 1)}, "knobs": {"kl_beta": 0.04}}
                        for k in range(7)])
    decisions = httpx.get(f"{url}/v1/runs/{run['id']}/decisions").json()["items"]
    last = max(d["step"] for d in decisions)
    assert last == 7  # ordered after the last reading (step 6)
    browser.get_log("browser")
    _open(browser, url, run["id"])
    probe = _chart(browser, "probe:policy_kl")
    # the readings 0.0001-0.0007 fill the axis; the setpoint 0.05 and the guardrail 0.5 are named
    assert float(probe["yMax"]) < 0.001 and float(probe["yMin"]) >= 0.0, probe
    assert "setpoint 0.05 above" in probe["title"] and "guardrail 0.5 above" in probe["title"], probe
    assert float(probe["xMax"]) >= last and float(probe["xMin"]) <= 0, probe
    knob = _chart(browser, "knob:kl_beta")
    assert float(knob["xMax"]) >= last
    assert severe(browser.get_log("browser")) == []


def test_dpo_ramp_starvation_breaches_and_a_halt_are_told_as_they_are(sqlite_service, browser) -> None:
    url = sqlite_service.url
    knobs = [{"name": "learning_rate", "value": 5e-5, "min": 5e-7, "max": 5e-5, "scale": "log", "max_step": 1.0},
             {"name": "kl_weight", "value": 0.0, "min": 0.0, "max": 2.0, "scale": "linear", "max_step": 0.25}]
    run = httpx.post(f"{url}/v1/runs", json={"policy": load_preset("dpo-kl").model_dump(mode="json"),
                                              "knobs": knobs}).json()
    # three readings under target (the lr controller cuts on its ramp), then the budget starves
    # kl_drift (its latest probe report says so), then three readings past the kl-cap (0.5): it
    # fires once (at step 6), halting the run: the controllers last read at step 5
    kl = [0.0, 0.0194, 0.035]
    _observe(url, run, [{"seq": k, "step": k, "probes": {"kl_drift": v},
                         "knobs": {"learning_rate": 5e-5, "kl_weight": 0.0}} for k, v in enumerate(kl)])
    _observe(url, run, [{"seq": 3, "step": 3, "metrics": {"probe_share": 0.5, "probe_starved.kl_drift": 1.0}}])
    _observe(url, run, [{"seq": 4 + k, "step": 4 + k, "probes": {"kl_drift": v}} for k, v in enumerate([0.6, 0.7])])
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()
    assert state["state"] == "running" and state["guardrails"]["kl-cap"]["breaches"] == 2
    _observe(url, run, [{"seq": 6, "step": 6, "probes": {"kl_drift": 0.8}},
                        {"seq": 7, "step": 7, "probes": {"kl_drift": 0.9}}])
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()
    events = httpx.get(f"{url}/v1/runs/{run['id']}/events").json()
    fired = [e for e in events if e["kind"] == "guardrail_breach"]
    assert state["state"] == "halted" and len(fired) == 1
    assert state["guardrails"]["kl-cap"]["fired"] == 1 and state["guardrails"]["kl-cap"]["breaches"] == 3

    browser.get_log("browser")
    _open(browser, url, run["id"])
    # the setpoint in force on the ramp is a line of its own, with the law's numbers explained
    probe = _chart(browser, "probe:kl_drift")
    legend = browser.execute_script("return [...document.querySelectorAll('[data-chart=\"probe:kl_drift\"] "
                                    ".u-legend .u-label')].map((e) => e.textContent)")
    assert "setpoint in force (ramp)" in legend, legend
    assert float(probe["xMax"]) >= 7
    explain = _row(browser, "#decisions tbody tr td.explain")["text"]
    assert "setpoint in force (ramp)" in explain, explain
    # the knob's axis is its bounds [0, 2], not uPlot's 0-100 for a flat line at 0
    knob = _chart(browser, "knob:kl_weight")
    assert (float(knob["yMin"]), float(knob["yMax"])) == (0.0, 2.0), knob
    # starvation counted: kl_drift reached the service 7 times; the controllers acted on it
    banner = _row(browser, "#starved")["text"]
    assert "no readings" not in banner and "received 7 readings of it" in banner, banner
    assert "kl-anchor" in banner and "kl-lr" in banner
    # breaches as stored (one firing), the readings past in a row told apart
    row = _row(browser, '#guardrails tr[data-guardrail="kl-cap"]')["text"].split()
    assert row[-3:] == ["3", "1", "yes"], row
    # the controllers stopped at the halt: their reading carries its step, beside the guardrail's newer one
    ctl = _row(browser, '#controllers tr[data-controller="kl-lr"]')
    assert ctl["stale"] == "1" and "0.7 (step 5)" in ctl["text"], ctl
    assert severe(browser.get_log("browser")) == []
