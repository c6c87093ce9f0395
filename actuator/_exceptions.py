r"""One exception hierarchy for everything Actuator raises on purpose.

    ActuatorError
    ├── ConfigError            bad settings or arguments given to a library call
    ├── PolicyError            a policy document failed validation (carries every error with its path)
    └── ClientError            talking to the controller service failed
        ├── ServiceUnavailable network error, timeout, 5xx / 503, or an answer that is not the
        │                      service's word (unreadable, incomplete in time, a proxy's 4xx page):
        │                      retrying later may work
        └── RequestRejected    the service refused (a 4xx with its error envelope): retrying the
                               same request will not work
            ├── Unauthorized   401: no or malformed token
            ├── Forbidden      403: token valid but not for this run / not admin
            └── NotFound       404

The other errors Actuator raises on purpose are ``ActuatorError``\ s where they are defined (each
also keeps the built-in base it had, so ``except ValueError`` still catches it):

    ActuatorError
    ├── agents:  KnobNotSupported (RuntimeError), ProbeError
    │            ├── ProbeSetupError, ProbeDataError (ValueError)
    │            │   ├── ProbeDataNotFoundError (FileNotFoundError), HotpotQAFormatError
    ├── store:   RunTokenRefused (PermissionError), ObservationRefused (ValueError),
    │            PolicyVersionConflict (RuntimeError)
    ├── tune:    WrongDirection (controllers' NotIdentifiable); UnknownController is a PolicyError
    ├── report:  RendererBusy (RuntimeError)
    └── api:     ApiError (an HTTP answer), Abandoned (a worker job given up)

``controllers/`` imports nothing of ours (its errors, ``ParameterError`` and ``NotIdentifiable``,
are ``ValueError``\ s): tests/actuator/test_exceptions.py checks every other public exception is in
this tree.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ActuatorError",
    "ConfigError",
    "PolicyError",
    "ClientError",
    "ServiceUnavailable",
    "RequestRejected",
    "Unauthorized",
    "Forbidden",
    "NotFound",
]


class ActuatorError(Exception):
    """Base class of every error Actuator raises deliberately."""


class ConfigError(ActuatorError, ValueError):
    """Invalid settings or arguments; the message names the field."""


class PolicyError(ActuatorError, ValueError):
    """A policy document is invalid. ``errors`` lists ``{"loc": "controllers.0.kp", "msg": ...}``."""

    def __init__(self, message: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class ClientError(ActuatorError):
    """Base class of errors from :class:`actuator.client.ActuatorClient`."""

    def __init__(self, message: str, *, status_code: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


class ServiceUnavailable(ClientError):
    """No usable answer from the service: unreachable, 5xx, an answer that cannot be read or is not
    complete within the timeout, a 4xx that is not the service's (no error envelope: a proxy, a
    portal). The request may succeed later."""


class RequestRejected(ClientError):
    """The service refused the request (a 4xx carrying its error envelope); sending it again will
    not help."""


class Unauthorized(RequestRejected):
    """401: the token is missing or unknown."""


class Forbidden(RequestRejected):
    """403: the token is valid but does not grant this (another run's token, not admin)."""


class NotFound(RequestRejected):
    """404: no such run, policy or decision."""
