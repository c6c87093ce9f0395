"""Issue 36, the run page a new user opens first, in a real headless Chromium against the real
service: starved probes are named, the filtered value is plotted at the step it was observed at
and the raw series is one line, a finished run shows neither "live" nor the operator actions,
"knobs in effect" follows the agent's acknowledgements, and decisions say which P/I/D they show.

The page's uPlot charts are read through a wrapper installed before the page loads (the page
itself exposes nothing for tests): every chart built is kept in ``window.__plots``."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from selenium.webdriver.common.by import By

sys.path.insert(0, str(Path(__file__).parent.parent / "hardening"))
from harden import post_obs, register, wait_until  # noqa: E402

POLICY = {"name": "first-contact-console",
          "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                           "setpoint": [[0, 0.1], [25, 0.2]], "kp": 1.0, "ki": 0.2,
                           "filter": {"kind": "ema", "alpha": 0.5}}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]
KEEP_PLOTS = """
window.__plots = [];
let real;
Object.defineProperty(window, "uPlot", {
  configurable: true,
  get() { return real; },
  set(u) {
    real = new Proxy(u, { construct(target, args) {
      const plot = Reflect.construct(target, args);
      window.__plots.push(plot);
      return plot;
    } });
  },
});
"""


@pytest.fixture
def page(browser, module_service):  # type: ignore[no-untyped-def]
    """The browser with the chart wrapper installed on every page it opens during the test."""
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": KEEP_PLOTS})
    yield browser
    browser.get("about:blank")  # close the page's stream before the service stops
    browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})


def _open(browser, url: str, run_id: str) -> None:  # type: ignore[no-untyped-def]
    browser.get(f"{url}/ui/runs/{run_id}")
    wait_until(lambda: browser.execute_script("return document.body.dataset.ready === '1'"), 15, "the run page")


def _visible(browser, css: str) -> bool:  # type: ignore[no-untyped-def]
    return any(e.is_displayed() for e in browser.find_elements(By.CSS_SELECTOR, css))


def _text(browser, css: str) -> str:  # type: ignore[no-untyped-def]
    """An element's text read in one script call (the runs list replaces its rows every 2 s)."""
    return browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css)


def _stream_text(browser) -> str:  # type: ignore[no-untyped-def]
    return browser.find_element(By.ID, "stream-state").text


def test_the_run_page_names_starved_probes_and_plots_filtered_values_where_observed(page, module_service):
    url = module_service.url
    run = register(url, policy=POLICY, knobs=KNOBS)
    drifts = [0.1, 0.3, 0.6, 0.9]
    for seq, drift in enumerate(drifts):
        step = 10 * (seq + 1)
        metrics = {"probe_share": 0.4, "probe_starved.policy_kl": float(seq)} if seq == len(drifts) - 1 else {}
        r = post_obs(url, run, [{"seq": seq, "step": step, "probes": {"kl_drift": drift}, "metrics": metrics,
                                 "knobs": {"learning_rate": 1e-3}}])
        assert r.status_code == 200, r.text
    decisions = httpx.get(f"{url}/v1/runs/{run['id']}/decisions").json()["items"]
    assert len(decisions) >= 2
    _open(page, url, run["id"])

    note = wait_until(lambda: [e for e in page.find_elements(By.ID, "starved") if e.is_displayed()], 10,
                      "the starved-probe note")[0]
    assert "policy_kl" in note.text and "starved" in note.text

    wait_until(lambda: page.execute_script(
        "return window.__plots.some(p => p.series[1] && p.series[1].label === 'kl_drift (raw)')"), 10, "the chart")
    xs, raw, filtered = page.execute_script("""
        const p = window.__plots.filter(p => p.series[1] && p.series[1].label === 'kl_drift (raw)').pop();
        return [p.data[0], p.data[1], p.data[2]];""")
    at = {x: (r, f) for x, r, f in zip(xs, raw, filtered)}
    # Each decision's filtered input is drawn at the step it was observed at (the decision applies
    # from the next step), where the raw value of that observation is.
    for d in decisions:
        observed = d["step"] - 1
        assert observed in at and at[observed][1] == pytest.approx(d["inputs"]["filtered"]), (d["step"], at)
    assert all(r is not None for r, f in at.values() if f is not None), at
    # The setpoint schedule's step (25) has no raw value: the raw series is drawn across it.
    assert at[25][0] is None
    assert page.execute_script("""
        const p = window.__plots.filter(p => p.series[1] && p.series[1].label === 'kl_drift (raw)').pop();
        return p.series[1].spanGaps === true;""")

    # Decisions say what their numbers are: this decision's moves in the reason, levels in the explanation.
    row = page.find_element(By.CSS_SELECTOR, f'#decisions tr[data-number="{decisions[-1]["number"]}"]')
    assert "ΔP" in row.text
    assert "levels after this decision: P" in row.find_element(By.CSS_SELECTOR, "td.explain").text

    page.get(f"{url}/ui")  # the runs list says it too
    assert "starved: policy_kl" in _text(page, f'#runs tr[data-run="{run["id"]}"]')


def test_a_finished_run_is_not_shown_live_nor_offered_actions(page, module_service):
    url = module_service.url
    run = register(url, policy=POLICY, knobs=KNOBS)
    r = post_obs(url, run, [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.1}}])
    assert r.status_code == 200, r.text
    _open(page, url, run["id"])
    wait_until(lambda: _stream_text(page) == "live", 10, "the running run followed live")
    assert _visible(page, 'button[data-action="pause"]') and _visible(page, 'button[data-action="halt"]')

    r = httpx.post(f"{url}/v1/runs/{run['id']}/finish", headers={"Authorization": f"Bearer {run['token']}"})
    assert r.status_code == 200, r.text
    wait_until(lambda: page.find_element(By.ID, "run-state").text == "finished", 10, "the page to show 'finished'")
    wait_until(lambda: "live" not in _stream_text(page), 5, "'live' to go")
    assert not _visible(page, "#actions button") and not _visible(page, "#actions form")

    _open(page, url, run["id"])  # and as first rendered
    assert page.find_element(By.ID, "run-state").text == "finished"
    assert "live" not in _stream_text(page) and not _visible(page, "#actions button")


def test_knobs_in_effect_follow_the_acknowledgements(page, module_service):
    url = module_service.url
    run = register(url, policy=POLICY, knobs=KNOBS)
    for seq, drift in enumerate([0.1, 0.5]):
        r = post_obs(url, run, [{"seq": seq, "step": 10 * (seq + 1), "probes": {"kl_drift": drift},
                                 "knobs": {"learning_rate": 1e-3}}])
        assert r.status_code == 200, r.text
    (decision,) = r.json()["decisions"]
    _open(page, url, run["id"])
    # Followed live: an observation at step 21 shows (what the stream replayed is shown by then too).
    repeat = {"seq": 2, "step": 21, "probes": {"kl_drift": 0.5}, "knobs": {"learning_rate": 1e-3}}
    r = post_obs(url, run, [repeat], last_decision=decision["number"])
    assert r.status_code == 200, r.text
    wait_until(lambda: page.find_element(By.ID, "run-step").text == "21", 10, "the live observation")
    cell = '#controllers tr[data-controller="drift"] td:last-child'
    assert _text(page, cell) == "0.001"  # (the table is rebuilt at each state read: read in one call)

    # The agent applies the decision after step 21 and says so on a repeat of its last observation,
    # as its sender does at the end of a run: the page shows the applied value without a reload.
    applied = float(f"{decision['new_value']:.4g}")
    r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                   json={"observations": [repeat],
                         "last_decision": decision["number"],
                         "applied": [{"number": decision["number"], "status": "applied", "step": decision["step"],
                                      "value": applied}]})
    assert r.status_code == 200 and r.json()["duplicates"] == 1, r.text
    wait_until(lambda: float(_text(page, cell)) == pytest.approx(applied, rel=1e-3), 10,
               "the acknowledged value in effect")
    page.get(f"{url}/ui")  # the runs list too
    text = _text(page, f'#runs tr[data-run="{run["id"]}"] td:last-child')
    assert float(text.removeprefix("learning_rate=")) == pytest.approx(applied, rel=1e-3)
