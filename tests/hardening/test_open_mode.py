"""Open mode (no admin token, the default of ``actuator serve`` and ``make demo``) cannot be steered
by another web site, and ``actuator serve`` refuses or warns about unsafe starts.

* A real headless Chromium loads a page from another origin (a second HTTP server on another
  port) that tries fetch and form POSTs on the run: the run's row and events are unchanged in the
  store, and the service counted the refusals (the requests did reach it). The console's own
  pages (same origin) still pause and halt the run, and a client with no Origin (httpx, as the
  agent and the CLI) still does everything.
* The header corpus (corpus/browser.yaml): another Origin, an opaque one, cross-site fetch
  metadata, a Host the service does not answer to (DNS rebinding).
* ``actuator serve --workers 2`` on SQLite exits non-zero saying why; on a non-loopback address
  without an admin token it warns at start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harden import POLICY, StoreView, register, wait_until
from actuator.testing import Service, free_port, make_service

CORPUS = Path(__file__).parent / "corpus" / "browser.yaml"


@pytest.fixture(scope="module")
def open_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, str]]:
    """The service as `actuator serve` starts it by default: loopback, SQLite, no admin token."""
    tmp = tmp_path_factory.mktemp("open-mode")
    db = f"sqlite:///{tmp / 'actuator.db'}"
    svc = make_service(db, log_dir=str(tmp)).start()
    assert httpx.post(f"{svc.url}/v1/policies", json=POLICY).status_code == 201  # no Origin: allowed
    yield svc, db
    svc.stop()
    assert "Traceback" not in svc.logs(), svc.logs()[-3000:]


@pytest.fixture
def view(open_service: tuple[Service, str]) -> Iterator[StoreView]:
    v = StoreView(open_service[1])
    yield v
    v.close()


def _rejected(url: str, status: int) -> float:
    """The service's count of requests refused with ``status`` (Prometheus)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'actuator_requests_rejected_total{{reason="{status}"}}'):
            return float(line.split()[-1])
    return 0.0


# -- a page of another site, in a real browser ----------------------------------------------------
ATTACK = """<!doctype html><html><head><meta charset="utf-8"><title>cat pictures</title></head><body>
<iframe name="sink" id="sink"></iframe>
<form id="halt-form" method="POST" action="{base}/halt" target="sink"><input name="x" value="1"></form>
<script>
(async () => {{
  const base = "{base}";
  const sent = [];
  const tries = [
    ["pause", {{method: "POST", mode: "no-cors"}}],
    ["resume", {{method: "POST", mode: "no-cors"}}],
    ["knobs/learning_rate/override", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
                                      body: JSON.stringify({{value: 0.005}})}}],
    ["halt", {{method: "POST", mode: "no-cors", keepalive: true}}],
  ];
  for (const [path, init] of tries) {{
    try {{ await fetch(base + "/" + path, init); sent.push(path); }} catch (e) {{ sent.push(path + " failed: " + e); }}
  }}
  navigator.sendBeacon(base + "/halt");
  const loaded = new Promise((resolve) => document.getElementById("sink").addEventListener("load", resolve));
  document.getElementById("halt-form").submit();
  await loaded;
  document.body.dataset.sent = JSON.stringify(sent);
  document.title = "done";
}})();
</script></body></html>"""


class _AttackPage(BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, under its chromedriver (make system-deps installs both)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    binary, driver = shutil.which("chromium") or "/usr/bin/chromium", shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not (os.path.exists(binary) and os.path.exists(driver)):
        pytest.fail("chromium and chromedriver are needed: make system-deps (apt-get install chromium chromium-driver)")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never downloads a browser or a driver
    profile = tempfile.mkdtemp(prefix="actuator-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    browser = webdriver.Chrome(service=DriverService(executable_path=driver), options=options)
    browser.set_page_load_timeout(30)
    yield browser
    browser.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_a_page_of_another_origin_cannot_steer_a_run_and_the_console_still_can(open_service, view, chromium):
    from selenium.webdriver.common.by import By

    svc, _ = open_service
    run = register(svc.url, policy=POLICY["name"], name="victim")
    before, events = view.run(run["id"]), view.counts()["events"]
    refused = _rejected(svc.url, 403)

    _AttackPage.page = ATTACK.format(base=f"{svc.url}/v1/runs/{run['id']}").encode()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _AttackPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # localhost:<other port> against 127.0.0.1:<service port>: another origin and another site
        chromium.get(f"http://localhost:{server.server_address[1]}/attack.html")
        wait_until(lambda: chromium.title == "done", 20, "the attack page to send its requests")
        sent = chromium.execute_script("return document.body.dataset.sent")
    finally:
        server.shutdown()
        server.server_close()

    # Four fetches, a beacon and a form: the browser sent each (opaque answers), the service
    # refused each, and nothing of the run changed.
    assert "failed" not in sent, sent
    wait_until(lambda: _rejected(svc.url, 403) >= refused + 6 or view.run(run["id"]) != before, 10,
               "the service to refuse six requests")
    assert view.run(run["id"]) == before
    assert view.counts()["events"] == events
    assert _rejected(svc.url, 403) == refused + 6

    # The console's own page (same origin) still pauses, resumes and halts the run.
    chromium.get(f"{svc.url}/ui/runs/{run['id']}")
    for action, state in (("pause", "paused"), ("resume", "running"), ("halt", "halted")):
        chromium.execute_script("document.getElementById('action-status').dataset.status = '';")
        chromium.find_element(By.CSS_SELECTOR, f'button[data-action="{action}"]').click()
        status = wait_until(lambda: chromium.find_element(By.ID, "action-status").get_attribute("data-status"), 10,
                            f"the console's answer to {action}")
        assert status == "200", chromium.find_element(By.ID, "action-status").text
        assert view.run(run["id"])["state"] == state

    # A client with no Origin and no fetch metadata (httpx: the agent, the CLI) does everything.
    other = register(svc.url, policy=POLICY["name"], name="cli")
    base = f"{svc.url}/v1/runs/{other['id']}"
    assert httpx.post(f"{base}/knobs/learning_rate/override", json={"value": 0.002}).status_code == 200
    assert httpx.delete(f"{base}/knobs/learning_rate/override").status_code == 200
    assert httpx.put(f"{base}/controllers/drift/setpoint", json={"setpoint": 0.2}).status_code == 200
    for action, state in (("pause", "paused"), ("resume", "running"), ("halt", "halted")):
        assert httpx.post(f"{base}/{action}").status_code == 200
        assert view.run(other["id"])["state"] == state
    # ... by any spelling of the loopback names it answers to
    for host in ("localhost", "127.0.0.1", "LOCALHOST"):
        assert httpx.get(f"{svc.url}/healthz", headers={"Host": f"{host}:{svc.port}"}).status_code == 200


def _cases() -> list[Any]:
    cases = yaml.safe_load(CORPUS.read_text())["cases"]
    names = [c["name"] for c in cases]
    assert len(set(names)) == len(names), "case names must be unique"
    return [pytest.param(c, id=c["name"]) for c in cases]


@pytest.mark.parametrize("case", _cases())
def test_browser_corpus_is_refused_and_changes_nothing(open_service, view, case):
    svc, _ = open_service
    run = register(svc.url, policy=POLICY, name="corpus")
    before = view.snapshot([run["id"]])
    headers = {k: v.replace("{port}", str(svc.port)) for k, v in case["headers"].items()}
    r = httpx.request(case["method"], svc.url + case["path"].replace("{run}", run["id"]), headers=headers,
                      content=case.get("body"))
    assert r.status_code == case["status"], r.text
    detail = r.json()["detail"]
    assert detail["message"].startswith(case["field"] + ": "), detail
    assert detail["errors"][0]["loc"] == f"header.{case['field']}", detail
    assert view.snapshot([run["id"]]) == before


# -- actuator serve ----------------------------------------------------------------------------------
def _serve(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    actuator = shutil.which("actuator", path=os.path.dirname(sys.executable)) or "actuator"
    return subprocess.run([actuator, "serve", "--port", str(free_port()), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _env(**settings: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ACTUATOR_")}, **settings}


def test_serve_refuses_several_workers_on_sqlite(tmp_path):
    r = _serve(["--workers", "2", "--database-url", f"sqlite:///{tmp_path / 'a.db'}"], _env())
    assert r.returncode != 0
    message = " ".join(r.stderr.split())  # rich wraps long lines
    assert "--workers 2" in message and "SQLite" in message and "Postgres" in message and "Redis" in message, message
    assert not (tmp_path / "a.db").exists(), "nothing was started or migrated"
    # the same from the environment (the Dockerfile's ACTUATOR_WORKERS, the default SQLite URL)
    r = _serve(["--workers", "3"], _env(ACTUATOR_DATABASE_URL=f"sqlite:///{tmp_path / 'b.db'}"))
    assert r.returncode != 0 and "SQLite" in r.stderr


def _started(tmp_path: Path, host: str, **settings: str) -> str:
    """The output of `actuator serve --host <host>` once it answers (then it is stopped)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    svc = make_service(f"sqlite:///{tmp_path / f'{host}.db'}", log_dir=str(tmp_path), serve_args=["--host", host],
                       extra_env=settings).start()
    try:
        admin = settings.get("ACTUATOR_ADMIN_TOKEN")  # token mode: /healthz needs a token
        auth = {"Authorization": f"Bearer {admin}"} if admin else {}
        assert httpx.get(f"{svc.url}/healthz", headers=auth).status_code == 200
    finally:
        svc.stop()
    return " ".join(svc.logs().split())  # rich wraps long lines


def test_serve_warns_when_open_mode_is_reachable_from_the_network(tmp_path):
    logs = _started(tmp_path / "open", "0.0.0.0")
    assert "no admin token" in logs and "listening on 0.0.0.0" in logs and "ACTUATOR_ADMIN_TOKEN" in logs, logs[-2000:]
    for what in ("register runs", "pause", "halt", "policies"):
        assert what in logs, (what, logs[-2000:])
    # not with an admin token, nor on loopback (open mode's default: a single user's machine)
    assert "no admin token" not in _started(tmp_path / "token", "0.0.0.0", ACTUATOR_ADMIN_TOKEN="t0ken")
    assert "no admin token" not in _started(tmp_path / "loopback", "127.0.0.1")
