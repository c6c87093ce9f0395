"""uvicorn's HTTP protocol with a deadline for a request's headers (slowloris).

uvicorn (0.54) bounds the idle time *between* requests (``timeout_keep_alive``) but not the time a
client takes to send a request's head: its keep-alive timer is cancelled by the first byte
received, and a new connection has no timer at all. A client that connects and sends nothing, or
a header a byte at a time, holds a connection (and its file descriptor) for ever; a few thousand
of them exhaust the process. ASGI middleware cannot help: it runs once the head is parsed.

Here the head must be complete within ``header_timeout`` seconds, counted from the connection
(first request) or from the first byte of the next request on a kept-alive connection, else the
connection is closed. Bodies and responses are not timed here (the body size is bounded by the
app; a response may stream for long, e.g. Server-Sent Events).

``actuator serve`` passes ``protocol_class(seconds)`` as uvicorn's ``http``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - uvicorn[standard] installs httptools
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

__all__ = ["protocol_class", "HeaderTimeoutHttpTools", "HeaderTimeoutH11"]

log = logging.getLogger("actuator.api")


class _HeaderDeadline:
    """Mixed in before one of uvicorn's HTTP protocol classes (which set ``transport``, ``loop``
    and ``cycle``: the request/response cycle, created once a request's head is parsed)."""

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    cycle: Any

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # asyncio.BaseProtocol's signature
        super().connection_made(transport)  # type: ignore[misc]  # the uvicorn protocol after this mixin
        self._arm()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if self._head_timer is None and (cycle is None or cycle.response_complete):
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)  # type: ignore[misc]
        if self.cycle is not cycle:  # a head was parsed: its request is under way
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expired(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            log.debug("closing a connection that sent no complete request head within %ss", self.header_timeout)
            self.transport.close()


class HeaderTimeoutH11(_HeaderDeadline, H11Protocol):
    pass


if HttpToolsProtocol is not None:
    class HeaderTimeoutHttpTools(_HeaderDeadline, HttpToolsProtocol):
        pass
else:  # pragma: no cover
    HeaderTimeoutHttpTools = HeaderTimeoutH11  # type: ignore[misc,assignment]


def protocol_class(header_timeout: float) -> Any:
    """What uvicorn's ``http`` takes: the protocol uvicorn's ``auto`` would pick (httptools when
    installed), with the deadline. A partial of a module-level class, so it pickles to workers."""
    return functools.partial(HeaderTimeoutHttpTools, header_timeout=header_timeout)
