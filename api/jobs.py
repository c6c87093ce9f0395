"""What the worker processes (:mod:`actuator.api.workers`) run: their loop (:func:`serve`) and
the jobs, a policy's validation, a simulation, a report's plot. Light to import (the standard
library here; the core only inside each job, no web framework): a worker starts with this module
and imports what its jobs need on first use.

A job answers ``(None, value)`` or, for a request the service refuses, ``(status, message,
errors)``: the refusal crosses the process boundary as plain data and the router raises it.
Answers leave the worker already serialized and capped, so the serving process only forwards bytes.
"""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["serve", "validation", "simulation", "render"]

PARENT_CHECK_SECONDS = 0.5


def _watch_parent(parent: int) -> None:
    """End this process as soon as its parent is gone (reparented: ``getppid`` changes)."""
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(PARENT_CHECK_SECONDS)


def serve(conn: Connection, parent: int, nice: int = 0, plugins: tuple[str, ...] = ()) -> None:
    """A worker process: run the jobs ``(fn, args, kwargs)`` it is sent, answer ``(ok, value)``.
    Ends on ``None``, on the end of its pipe (the parent closed it or died) and, while a job
    runs, when its parent is gone (the watchdog thread). ``nice``: added to its scheduling
    niceness, so that on busy cores the processes serving requests go first. ``plugins``: the
    modules the service imported at start (``ACTUATOR_PLUGINS``: laws it knows), imported here too."""
    if nice:
        os.nice(nice)
    if plugins:
        from actuator.config import load_plugins

        load_plugins(plugins)
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watchdog", daemon=True).start()
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        fn, args, kwargs = job
        try:
            answer: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - the caller re-raises it
            answer = (False, exc)
        try:
            conn.send(answer)
        except (EOFError, OSError):
            return
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
            conn.send((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        del job, fn, args, kwargs, answer

Refusal = tuple[int, str | None, list[dict[str, Any]]]


def _policy(doc: dict[str, Any]) -> Any:
    """The parsed document, or the 422 refusal naming every error."""
    from actuator._exceptions import PolicyError
    from actuator.policy import load_policy

    try:
        return load_policy(doc)
    except PolicyError as exc:
        return (422, str(exc), list(exc.errors or []))


def _knobs(raw: Any) -> dict[str, dict[str, Any]] | Refusal:
    """A ``knobs`` list as registration takes it (each a knob spec, names unique), by name."""
    from pydantic import ValidationError

    from actuator.policy import policy_errors
    from actuator.schemas import RunCreate

    try:
        knobs = RunCreate.model_validate({"policy": "-", "knobs": raw}).knobs
    except ValidationError as exc:
        return (422, None, [{"loc": f"body.{e['loc']}", "msg": e["msg"]} for e in policy_errors(exc)])
    return {k.name: k.model_dump(mode="json") for k in knobs}


def validation(doc: dict[str, Any]) -> tuple[None, dict[str, Any]] | Refusal:
    """POST /v1/policies/validate: every error of the document with its path and, when it has
    ``knobs`` beside its fields, against those knobs."""
    from actuator.engine import Engine
    from actuator.policy import PolicyDocument

    doc = dict(doc)
    knobs = _knobs(doc.pop("knobs")) if "knobs" in doc else None  # a policy document has no 'knobs' field
    if isinstance(knobs, tuple):
        return knobs
    parsed = _policy(doc)
    if not isinstance(parsed, PolicyDocument):
        _, message, errors = parsed
        return None, {"valid": False, "errors": errors or [{"loc": "(document)", "msg": message}]}
    errors = Engine(parsed).knob_errors(knobs) if knobs is not None else []
    return None, {"valid": not errors, "errors": errors}


def _every(n: int, points: int) -> int:
    """k such that every k-th of ``n`` items and the last are at most ``points``."""
    return 1 if n <= points else max(1, -(-(n - 1) // (points - 1)))


def simulation(doc: dict[str, Any], stored: bool, knobs: dict[str, dict[str, Any]], observations: list[Any],
               total: int, max_decisions: int, trace_points: int) -> tuple[None, bytes] | Refusal:
    """POST /v1/policies/simulate: the replay's answer as JSON bytes (``SimulationPublic``), its
    lists capped at ``max_decisions`` (the first ones; the totals count all) and its trace
    decimated to ``trace_points`` points."""
    from actuator.engine import Engine
    from actuator.policy import PolicyDocument
    from actuator.schemas import SimulationPublic
    from actuator.simulate import simulate

    parsed = PolicyDocument.model_validate(doc) if stored else _policy(doc)
    if not isinstance(parsed, PolicyDocument):
        return parsed
    errors = [{"loc": f"body.policy.{e['loc']}", "msg": e["msg"]} for e in Engine(parsed).knob_errors(knobs)]
    if errors:
        return (422, None, errors)
    result = simulate(parsed, knobs, observations)
    trace = result["trace"]
    every = _every(len(trace), trace_points)
    if every > 1:
        trace = [*trace[:-1:every], trace[-1]] if (len(trace) - 1) % every else trace[::every]
    answer = {**result, "trace": trace, "trace_every": every, "observations_total": total,
              **{f"{k}_total": len(result[k]) for k in ("decisions", "actions", "events")},
              **{k: result[k][:max_decisions] for k in ("decisions", "actions", "events")}}
    return None, SimulationPublic.model_validate(answer).model_dump_json().encode()


def render(report: dict[str, Any], fmt: str, max_panels: int) -> tuple[None, bytes | str]:
    """A report's PNG (bytes) or HTML page (str)."""
    from actuator.report import render_html, render_png

    if fmt == "png":
        return None, render_png(report, max_panels=max_panels)
    return None, render_html(report, max_panels=max_panels)
