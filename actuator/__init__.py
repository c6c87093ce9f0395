"""Actuator: closed-loop control of LLM post-training."""

from ._exceptions import (
    ActuatorError,
    ClientError,
    ConfigError,
    Forbidden,
    NotFound,
    PolicyError,
    RequestRejected,
    ServiceUnavailable,
    Unauthorized,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "ActuatorError",
    "ClientError",
    "ConfigError",
    "Forbidden",
    "NotFound",
    "PolicyError",
    "RequestRejected",
    "ServiceUnavailable",
    "Unauthorized",
]
