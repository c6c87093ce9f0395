"""No orphans: the service's worker processes end with it, whether it stops gracefully (SIGTERM)
or is killed (SIGKILL: each worker notices its parent is gone and exits, also in the middle of a
job), and a test session that leaves a process behind fails (tests/no_orphans.py, which
tests/conftest.py installs for the whole suite)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx

from actuator.testing import make_service
from harden import bearer, post_obs, register, wait_until
from actuator.testing import HEAVY_KNOBS as KNOBS, HEAVY_POLICY as HEAVY, heavy_probes as probes
from test_costly_endpoints import abandon, alive, descendants, raw_post, workers

TESTS = Path(__file__).resolve().parents[1]


def _gone(pids: set[int]) -> bool:
    return not any(alive(p) for p in pids)


def test_the_worker_processes_end_with_the_service_on_a_graceful_stop(tmp_path):
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path),
                       extra_env={"ACTUATOR_WORKER_PROCESSES": "2"}).start()
    try:
        assert httpx.post(f"{svc.url}/v1/policies/validate", json=HEAVY, timeout=120).json()["valid"]
        assert workers(svc), descendants(svc.proc.pid)  # the validation ran in a worker process
        tree = set(descendants(svc.proc.pid))
        svc.stop()  # SIGTERM: uvicorn's graceful shutdown
        wait_until(lambda: _gone(tree), 30, f"the service's processes {sorted(tree)} to end after its stop")
    finally:
        svc.kill()


def test_the_worker_processes_exit_when_the_service_is_killed_even_mid_job(tmp_path):
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path),
                       extra_env={"ACTUATOR_WORKER_PROCESSES": "2"}).start()
    tree: set[int] = set()
    try:
        run = register(svc.url, policy=HEAVY, knobs=KNOBS, name="heavy")
        for start in range(0, 5000, 1000):
            r = post_obs(svc.url, run, [{"seq": i, "step": i + 1, "probes": probes(i)}
                                        for i in range(start, start + 1000)], timeout=300)
            assert r.status_code == 200, r.text
        # one worker busy with seconds of simulation, another idle after a validation
        s = raw_post(svc, "/v1/policies/simulate", {"policy": HEAVY, "run_id": run["id"]})
        wait_until(lambda: workers(svc), 120, "a worker process for the simulation")
        r = httpx.post(f"{svc.url}/v1/policies/validate", json=HEAVY, headers=bearer(None), timeout=120)
        assert r.status_code == 200, r.text
        assert len(workers(svc)) == 2, descendants(svc.proc.pid)
        tree = set(descendants(svc.proc.pid))
        svc.kill()  # SIGKILL: no shutdown runs in the service
        wait_until(lambda: _gone(tree), 30, f"the killed service's processes {sorted(tree)} to exit")
        abandon(s)
    finally:
        svc.kill()
        for pid in tree:  # whatever the outcome, nothing stays behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_tune_worker_does_not_outlive_a_killed_service(tmp_path):
    """Issue 51's case: the process a tune starts stayed behind, orphaned, for hours after its
    service was killed. Here the tune is refused (the knob never moved: 409), after its fit ran in
    the worker process; the service is killed while that process waits for the next fit."""
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path)).start()
    tree: set[int] = set()
    try:
        policy = {"name": "tune-me", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                                       "setpoint": 0.4, "kp": 1.0, "ki": 0.2}]}
        run = register(svc.url, policy=policy)
        r = post_obs(svc.url, run, [{"seq": i, "step": 10 * i, "probes": {"kl_drift": 0.3 + 0.001 * (i % 3)},
                                     "knobs": {"learning_rate": 1e-3}} for i in range(60)])
        assert r.status_code == 200, r.text
        r = httpx.post(f"{svc.url}/v1/policies/tune", json={"run_id": run["id"], "controller": "drift"}, timeout=120)
        assert r.status_code == 409, r.text
        tree = set(descendants(svc.proc.pid))
        assert tree, "the fit ran in a process of its own"
        svc.kill()
        wait_until(lambda: _gone(tree), 30, f"the killed service's processes {sorted(tree)} to exit")
    finally:
        svc.kill()
        for pid in tree:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


LEAKY = '''
import subprocess, sys, os

def test_starts_a_process_and_leaves_it(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    # and one that leaves the session's process tree (its parent exits at once): found by its mark
    subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    "'import time; time.sleep(601)'], start_new_session=True)"], check=True)
    with open(os.environ["LEAK_PIDS"], "a") as fh:
        fh.write(f"{child.pid}\\n")
'''
CLEAN = '''
import subprocess, sys

def test_starts_a_process_and_ends_it():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    child.terminate()
    child.wait(10)
'''


def _session(tmp_path: Path, name: str, body: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / f"test_{name}.py").write_text(textwrap.dedent(body))
    pids = folder / "pids"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "LEAK_PIDS": str(pids)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no_orphans",
                           *args, str(folder)], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    return proc, pids


def _sleepers(seconds: str) -> set[int]:
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if f"time.sleep({seconds})".encode() in cmd and alive(int(entry.name)):
                out.add(int(entry.name))
    return out


def test_a_session_that_leaves_a_process_behind_fails_and_the_process_is_ended(tmp_path):
    for args in ((), ("-n", "2")):  # alone, and under pytest-xdist (each worker checks its own)
        before = _sleepers("600") | _sleepers("601")
        proc, pids = _session(tmp_path, "leaky" + "".join(args).replace("-", "_").replace(" ", ""), LEAKY, *args)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, (args, out)
        assert "1 passed" in out and "processes left behind" in out, (args, out)
        leaked = int(pids.read_text().split()[0])
        assert f"pid {leaked}:" in out, (args, out)
        assert "time.sleep(601)" in out, (args, out)  # the one that left the tree, found by its mark
        assert not ((_sleepers("600") | _sleepers("601")) - before), "the check did not end what it found"


def test_a_session_that_ends_its_processes_passes(tmp_path):
    proc, _ = _session(tmp_path, "clean", CLEAN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "processes left behind" not in proc.stdout
