"""The console in token mode, in a real headless Chromium against the real service on Postgres and
Redis: a page opened without a token shows no data and says why (401); the token typed once is
kept for the tab (sessionStorage: never a cookie, a URL or localStorage) and sent with every
request, so every page, the live stream (through a short-lived ticket: EventSource sends no
header) and the policies read with it; a viewer token reads but cannot act (403); a wrong token is
told so (401); a run's own token opens that run's page and no other (403)."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.common.by import By

from actuator.testing import Service, make_service, wait_until

ADMIN, VIEWER = "admin-" + uuid.uuid4().hex, "viewer-" + uuid.uuid4().hex
POLICY = {
    "name": "console-tokens",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1, "kp": 1.0,
                     "ki": 0.2}],
}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def token_service(postgres, redis_server, tmp_path) -> Iterator[Service]:  # type: ignore[no-untyped-def]
    db = postgres.create_database(f"uitok{os.getpid()}_{time.monotonic_ns()}")
    svc = make_service(db, redis_url=redis_server.url, admin_token=ADMIN, log_dir=str(tmp_path),
                       extra_env={"ACTUATOR_VIEWER_TOKEN": VIEWER}).start()
    yield svc
    svc.stop()


def wait_for(what: str, check, timeout: float = 20.0, browser=None) -> None:  # type: ignore[no-untyped-def]
    try:
        wait_until(check, timeout, what)
    except RuntimeError as exc:
        if browser is None:
            raise
        state = js(browser, "const m = (id) => { const e = document.getElementById(id); return e && "
                            "[e.textContent, e.hidden]; }; return {page: document.body.dataset.page, "
                            "locked: m('locked-message'), auth: m('auth-message'), "
                            "token: sessionStorage.getItem('actuator.adminToken'), url: location.href}")
        raise AssertionError(f"{exc}; the page: {state}; its log: {browser.get_log('browser')}") from None


def js(browser, script: str, *args):  # type: ignore[no-untyped-def]
    return browser.execute_script(script, *args)


def use_token(browser, token: str) -> None:  # type: ignore[no-untyped-def]
    # the field has no name: even a submit the script has not taken over carries no token
    assert browser.find_element(By.ID, "admin-token").get_attribute("name") in (None, "")
    browser.find_element(By.ID, "token-forget").click()
    browser.find_element(By.ID, "admin-token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, '#token-form button[type="submit"]').click()
    wait_for("the token kept for the tab", lambda: js(
        browser, "return sessionStorage.getItem('actuator.adminToken')") == token, browser=browser)
    assert token not in browser.current_url


def locked_message(browser) -> str:  # type: ignore[no-untyped-def]
    return js(browser, "const m = document.getElementById('locked-message'); return m ? m.textContent : ''") or ""


def test_console_reads_with_the_token_typed_once(token_service, browser) -> None:  # type: ignore[no-untyped-def]
    url = token_service.url
    api = httpx.Client(base_url=url, timeout=30, headers=bearer(ADMIN))
    assert api.post("/v1/policies", json=POLICY).status_code == 201
    a = api.post("/v1/runs", json={"name": "tok-run-a", "policy": POLICY["name"], "knobs": KNOBS}).json()
    b = api.post("/v1/runs", json={"name": "tok-run-b", "policy": POLICY["name"], "knobs": KNOBS}).json()

    def observe(run: dict, seq: int, step: int) -> None:
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=bearer(run["token"]), timeout=30,
                       json={"observations": [{"seq": seq, "step": step, "probes": {"kl_drift": 0.3}}]})
        assert r.status_code == 200, r.text

    observe(a, 0, 1)
    try:
        # Without a token: no data, and the reason.
        browser.get(f"{url}/ui")
        wait_for("the locked page", lambda: "401" in locked_message(browser))
        assert "token" in locked_message(browser).lower()
        assert "tok-run-a" not in browser.page_source and a["id"] not in browser.page_source
        assert "viewer or admin token" in browser.find_element(By.ID, "token-state").text

        # The viewer token, typed once: the runs list appears in place.
        use_token(browser, VIEWER)
        row = f'#runs tr[data-run="{a["id"]}"]'
        wait_for("run A in the runs list", lambda: js(browser, "return !!document.querySelector(arguments[0])", row))
        assert js(browser, "return sessionStorage.getItem('actuator.adminToken')") == VIEWER
        assert js(browser, "return localStorage.length") == 0 and not browser.get_cookies()
        assert VIEWER not in browser.current_url
        # the list refreshes itself with the token (a run registered now shows up without a reload)
        c = api.post("/v1/runs", json={"name": "tok-run-c", "policy": POLICY["name"], "knobs": KNOBS}).json()
        wait_for("run C in the refreshed list", lambda: js(
            browser, "return !!document.querySelector(arguments[0])", f'#runs tr[data-run="{c["id"]}"]'), 10)

        # A new page of the same tab: the token is not asked again. The run page reads the run and
        # follows its live stream (ticket), and an observation posted now shows without a reload.
        browser.get(f"{url}/ui/runs/{a['id']}")
        wait_for("the run page reading and following its stream", lambda: js(
            browser, "return document.body.dataset.ready === '1' && document.body.dataset.stream === 'open'"), 30)
        assert js(browser, "return document.body.dataset.page") == "run"
        observe(a, 1, 77)
        wait_for("step 77 on the page", lambda: browser.find_element(By.ID, "run-step").text == "77", 10)
        assert js(browser, "return !!document.querySelector('#charts .uplot')")
        assert not [u for u in js(browser, "return performance.getEntriesByType('resource').map(e => e.name)")
                    if VIEWER in u], "the token went into a URL"
        # A viewer cannot act: refused (403), with the service's reason; nothing changes.
        js(browser, "document.getElementById('action-status').dataset.status = ''")
        browser.find_element(By.CSS_SELECTOR, 'button[data-action="pause"]').click()
        wait_for("the answer to pause", lambda: browser.find_element(By.ID, "action-status").get_attribute(
            "data-status"), 10)
        status = browser.find_element(By.ID, "action-status")
        assert status.get_attribute("data-status") == "403" and "admin token" in status.text
        assert api.get(f"/v1/runs/{a['id']}").json()["state"] == "running"

        # The policies pages read with it too (their scripts start once the page is in place).
        browser.get(f"{url}/ui/policies")
        wait_for("the policies list", lambda: POLICY["name"] in js(
            browser, "const t = document.getElementById('policies'); return t ? t.textContent : ''"))
        assert js(browser, "return !!document.getElementById('validate-form')")

        # A wrong token: told so, clearly, and nothing shown.
        use_token(browser, "not-a-token")
        browser.get(f"{url}/ui")
        wait_for("the refusal", lambda: "401" in locked_message(browser)
                 and not browser.find_element(By.ID, "auth-message").get_attribute("hidden"), browser=browser)
        assert "did not accept this tab's token" in browser.find_element(By.ID, "auth-message").text
        assert "tok-run-a" not in browser.page_source

        # A run's own token opens its page, and not another run's (403) nor the runs list (403).
        use_token(browser, a["token"])
        browser.get(f"{url}/ui/runs/{b['id']}")
        wait_for("run B refused to run A's token", lambda: "403" in locked_message(browser))
        assert "does not grant" in browser.find_element(By.ID, "auth-message").text
        assert "tok-run-b" not in browser.page_source
        browser.get(f"{url}/ui/runs/{a['id']}")
        wait_for("run A's page with its own token", lambda: js(
            browser, "return document.body.dataset.ready === '1' && document.body.dataset.stream === 'open'"), 30)
        browser.get(f"{url}/ui")
        wait_for("the runs list refused to a run's token", lambda: "403" in locked_message(browser))
    finally:
        browser.get("about:blank")  # close the page's stream before the service stops
        api.close()


def test_open_mode_console_needs_no_token(browser, tmp_path) -> None:  # type: ignore[no-untyped-def]
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path)).start()
    try:
        run = httpx.post(f"{svc.url}/v1/runs", json={"name": "open-run", "policy": POLICY, "knobs": KNOBS}).json()
        browser.get(f"{svc.url}/ui/runs/{run['id']}")
        wait_for("the run page following its stream", lambda: js(
            browser, "return document.body.dataset.ready === '1' && document.body.dataset.stream === 'open'"), 30)
        assert js(browser, "return document.body.dataset.auth") == "open"
        assert browser.find_element(By.ID, "token-state").text == "no token: read only"
        assert browser.find_element(By.ID, "auth-message").get_attribute("hidden") is not None
    finally:
        browser.get("about:blank")
        svc.stop()
