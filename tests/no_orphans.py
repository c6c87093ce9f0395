"""The suite leaves no process behind: at the end of a session, every process it started (the
service, its worker processes, the Postgres and Redis the fixtures started, a browser) must be
gone. Imported by ``tests/conftest.py``; under pytest-xdist each worker checks its own.

A process counts as the session's when it descends from the session's process, or when its
environment carries the session's mark (:data:`MARK`, set at import; every process started
from the session inherits it, also those that left the tree: a daemon, a process whose parent
died). The service launcher of ``actuator.testing`` (closed at exit anyway) is closed first.
What is still there after a grace period fails the session: named, then killed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

__all__ = ["MARK", "leftovers", "pytest_sessionfinish", "pytest_testnodedown", "pytest_terminal_summary"]

MARK = "TESTS_SESSION_MARK"  # no ACTUATOR_ prefix: make_service drops those from a service's environment
_VALUE = f"{os.getpid()}-{time.time_ns()}"
os.environ[MARK] = _VALUE
GRACE_SECONDS = 15.0
_REPORT = pytest.StashKey[list[str]]()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def _marked(pid: int) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARK}={_VALUE}".encode() in env.split(b"\0")


def _describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"pid {pid}: {cmd[:200]}"


def leftovers(root: int | None = None) -> list[int]:
    """Live processes (not zombies) of this session but ``root`` itself (default: this process)."""
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[0] != "Z":
                parents[int(entry.name)] = st[1]

    def descends(pid: int) -> bool:
        seen = set()
        while pid in parents and pid not in seen:
            seen.add(pid)
            pid = parents[pid]
            if pid == root:
                return True
        return False

    return sorted(p for p in parents if p != root and (descends(p) or _marked(p)) and not _own_tracker(p, root))


def _own_tracker(pid: int, root: int) -> bool:
    """The multiprocessing resource tracker of the session's process: it ends with that process."""
    st = _stat(pid)
    if st is None or st[1] != root:
        return False
    try:
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _close_launcher() -> None:
    import actuator.testing as testing

    if testing._launcher is not None:
        testing._launcher.close()
        testing._launcher = None


def _check() -> list[str]:
    """The session's processes still alive after the grace period, described, then killed."""
    _close_launcher()
    deadline = time.monotonic() + GRACE_SECONDS
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers()
    found = [_describe(p) for p in left]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # the xdist controller: its workers (its children) check their own (pytest_testnodedown)
        if config.stash.get(_REPORT, []):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        return
    found = _check()
    if hasattr(config, "workerinput"):  # an xdist worker: the controller reports it
        config.workeroutput["orphans"] = found  # type: ignore[attr-defined]
    config.stash[_REPORT] = found
    if found:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: a worker's leftovers fail the session."""
    found = getattr(node, "workeroutput", {}).get("orphans") or []
    if found:
        config = node.config
        config.stash[_REPORT] = [*config.stash.get(_REPORT, []), *found]
        session = getattr(config, "_orphan_session", None)
        if session is not None:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._orphan_session = session  # type: ignore[attr-defined]


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    found = config.stash.get(_REPORT, [])
    if found:
        session = getattr(config, "_orphan_session", None)
        if session is not None:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        terminalreporter.section("processes left behind", red=True)
        terminalreporter.line(f"{len(found)} process(es) started by the tests were still running "
                              f"{GRACE_SECONDS:g} s after the session (now killed):", red=True)
        for line in found:
            terminalreporter.line("  " + line)
