"""actuator.testing, the real servers a user's own tests start on loopback: the service answers
and stores in the ``with`` block and is gone after it, on SQLite by default and on the Postgres
and Redis the module starts; a missing binary names its Debian package; importing the module
loads none of the server's packages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest
import redis as redis_client

import actuator.testing

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "testing.md"
POLICY = {"name": "quiet"}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]


def _register_and_observe(url: str) -> str:
    r = httpx.post(f"{url}/v1/runs", json={"policy": POLICY, "knobs": KNOBS})
    assert r.status_code == 201, r.text
    run = r.json()
    obs = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                     json={"observations": [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.1}}]})
    assert obs.status_code == 200, obs.text
    return str(run["id"])


def test_the_service_runs_in_the_with_block_and_is_gone_after():
    with actuator.testing.service() as url:
        assert httpx.get(f"{url}/healthz").json()["status"] == "ok"
        run_id = _register_and_observe(url)
        assert httpx.get(f"{url}/v1/runs/{run_id}").json()["last_step"] == 1
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=2)


def test_services_started_in_one_process_share_one_launcher(monkeypatch):
    """The app is imported once per process, not once per service: pytest's name of the running
    test, which changes with every test, does not start the launcher again (the suite's service
    fixtures each waited for a new import of the app); another variable does."""
    def launcher_pid() -> int:
        assert actuator.testing._launcher is not None
        return actuator.testing._launcher.proc.pid

    with actuator.testing.service():
        first = launcher_pid()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/x.py::test_other (setup)")
    with actuator.testing.service():
        assert launcher_pid() == first
    monkeypatch.setenv("ACTUATOR_TESTING_PROBE_VARIABLE", "1")  # a service setting: given at fork, no new import
    with actuator.testing.service():
        assert launcher_pid() == first
    monkeypatch.setenv("SOME_IMPORT_TIME_VARIABLE", "1")
    with actuator.testing.service():
        assert launcher_pid() != first


def test_the_service_on_the_postgres_and_redis_it_starts():
    with actuator.testing.postgres() as pg, actuator.testing.redis() as rd:
        database = pg.create_database("integration")
        with actuator.testing.service(database, redis_url=rd.url) as url:
            run_id = _register_and_observe(url)
        with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname=integration") as conn:
            assert conn.execute("SELECT id FROM runs").fetchall() == [(run_id,)]
        assert redis_client.Redis.from_url(rd.url).keys() != []  # the run's live state
    assert not os.path.exists(pg.datadir)


def test_a_postgres_removed_after_a_stop_leaves_no_data_directory():
    """The session's and the restart tests' servers end with remove(): a stopped server's data
    directory (~500 MB) would otherwise stay in /tmp after every test run."""
    pg = actuator.testing.start_postgres()
    assert os.path.isdir(pg.datadir)
    pg.stop()  # as a restart test leaves it
    pg.remove()
    assert not os.path.exists(pg.datadir)
    pg.remove()  # twice is harmless


def test_a_service_that_cannot_start_raises_with_its_log(tmp_path):
    with pytest.raises(RuntimeError, match="exited before it answered") as exc:  # not after the 60 s
        with actuator.testing.service(f"sqlite:///{tmp_path / 'missing' / 'dir' / 'a.db'}"):
            pass
    assert "its log" in str(exc.value) and "Application startup failed" in str(exc.value)  # why


def test_a_missing_binary_names_the_package_to_install():
    with pytest.raises(RuntimeError, match=r"apt-get install -y no-such-package"):
        actuator.testing.need_binary("no-such-server-binary", "no-such-package")


def test_importing_it_loads_none_of_the_servers_packages():
    code = ("import sys, actuator.testing; print(sorted(m for m in ('fastapi', 'sqlalchemy', 'uvicorn', 'psycopg', "
            "'redis', 'starlette', 'pydantic_settings', 'actuator.api', 'actuator.agents') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_examples_of_docs_reference_testing_md_run():
    """Its blocks marked run-by this file run as written (the fixture block defines its fixture)."""
    text = PAGE.read_text()
    run = re.findall(r"<!-- snippet: run-by tests/actuator/test_testing.py -->\n```python\n(.*?)^```", text, re.M | re.S)
    assert len(run) == 2
    for body in run:
        scope: dict[str, object] = {}
        exec(compile(body, str(PAGE), "exec"), scope)  # noqa: S102 - the documentation's own example
    assert callable(scope["actuator_url"])
