"""Guardrail notifications to a webhook: what fired reaches a person without anyone watching.

With ``ACTUATOR_WEBHOOK_URL`` set, every guardrail firing (a breach whose action is ``alert``,
``adjust``, ``halt`` or ``rollback``) is POSTed there as JSON::

    {"event": "halt", "run": "<run id>", "step": 6, "guardrail": "qa-floor", "probe": "hotpotqa.gold_logprob",
     "reading": -3.2, "threshold": -3.0, "action": "halt", "reason": "guardrail qa-floor: ...",
     "console": "http://127.0.0.1:8000/ui/runs/<run id>"}

``event`` is ``halt`` or ``rollback`` for those actions, ``breach`` for the others.

Ingest never waits on the receiver: a notification goes into a bounded queue (``put`` without
blocking) and one background thread per service process delivers it, retrying a failed POST (a
connection error, a timeout or a non-2xx answer) ``retries`` times with exponential backoff
(``backoff``, 2x, 4x, ... seconds). A full queue drops the new notification; drops, deliveries and
notifications given up after their retries are counted (``actuator_notifications_total{outcome}``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import httpx

from .schemas import GuardrailBreach

__all__ = ["Notifier", "OUTCOMES", "breach_payload"]

log = logging.getLogger("actuator.notify")

OUTCOMES = ("sent", "failed", "dropped")


def breach_payload(run_id: str, event: GuardrailBreach, *, probe: str | None, console: str) -> dict[str, Any]:
    """The JSON body of one guardrail firing."""
    return {"event": event.action if event.action in ("halt", "rollback") else "breach", "run": run_id,
            "step": event.step, "guardrail": event.guardrail, "probe": probe, "reading": event.value,
            "threshold": event.threshold, "action": event.action, "reason": event.reason,
            "console": f"{console.rstrip('/')}/ui/runs/{run_id}"}


class Notifier:
    """Deliver notifications to ``url`` from a background thread (see the module's docstring).

    ``count(outcome)`` is called once per notification with ``sent``, ``failed`` (given up after
    its retries) or ``dropped`` (the queue was full)."""

    def __init__(self, url: str, *, console: str, queue_size: int = 1000, retries: int = 3, backoff: float = 0.5,
                 timeout: float = 5.0, count: Callable[[str], None] = lambda outcome: None) -> None:
        self.url, self.console = url, console
        self.retries, self.backoff, self.timeout = retries, backoff, timeout
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=queue_size)
        self._count = count
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._deliver_all, name="actuator-webhook", daemon=True)
        self._thread.start()

    def notify_ingest(self, out: Any) -> None:
        """The guardrail firings of one ingest (a store ``IngestOutcome``), queued."""
        guardrails = getattr(out.run.context, "guardrails", {})
        for ev in out.events:
            if isinstance(ev, GuardrailBreach):
                probe = getattr(guardrails.get(ev.guardrail), "probe", None)
                self.submit(breach_payload(out.run.id, ev, probe=probe, console=self.console))

    def submit(self, payload: dict[str, Any]) -> bool:
        """Queue ``payload`` without waiting; False (counted as dropped) when the queue is full."""
        try:
            self.queue.put_nowait(payload)
        except queue.Full:
            self._count("dropped")
            log.warning("webhook queue full (%d): notification for run %s dropped", self.queue.maxsize,
                        payload.get("run"))
            return False
        return True

    def _deliver_all(self) -> None:
        with httpx.Client(timeout=self.timeout) as client:
            while True:
                payload = self.queue.get()
                if payload is None:
                    return
                self._count("sent" if self._deliver(client, payload) else "failed")

    def _deliver(self, client: httpx.Client, payload: dict[str, Any]) -> bool:
        problem = ""
        for attempt in range(self.retries + 1):
            try:
                r = client.post(self.url, json=payload)
                if 200 <= r.status_code < 300:
                    return True
                problem = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if attempt < self.retries and self._closed.wait(self.backoff * 2 ** attempt):
                break  # closing: no more waiting on this receiver
        log.warning("webhook %s: notification for run %s not delivered after %d attempts (%s)", self.url,
                    payload.get("run"), self.retries + 1, problem)
        return False

    def close(self, timeout: float = 5.0) -> None:
        """Try what is queued once more each, within ``timeout`` seconds, and stop."""
        self._closed.set()
        try:
            self.queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
