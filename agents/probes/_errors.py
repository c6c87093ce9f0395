"""The probes' exception hierarchy.

::

    ProbeError                      anything a probe refuses to do
    ├── ProbeSetupError             measure() called before setup() / no reference model to compare to
    └── ProbeDataError (ValueError) held-out data unusable: empty, wrong column, no token to score
        ├── ProbeDataNotFoundError (FileNotFoundError)  a path the user gave does not exist
        └── HotpotQAFormatError     one HotpotQA record is malformed: says which record and field

Data errors are raised when a probe is constructed, so a run fails before training starts
rather than at the first probe step.
"""

from __future__ import annotations
from actuator._exceptions import ActuatorError

__all__ = [
    "ProbeError",
    "ProbeSetupError",
    "ProbeDataError",
    "ProbeDataNotFoundError",
    "HotpotQAFormatError",
]


class ProbeError(ActuatorError):
    """Base class of every error raised by ``actuator.agents.probes``."""


class ProbeSetupError(ProbeError):
    """A probe is used in a state where it cannot measure (e.g. no reference model yet)."""


class ProbeDataError(ProbeError, ValueError):
    """Held-out data cannot be used: empty, missing a field, nothing left to score."""


class ProbeDataNotFoundError(ProbeDataError, FileNotFoundError):
    """A data file the user named does not exist."""


class HotpotQAFormatError(ProbeDataError):
    """A HotpotQA record does not follow the official format.

    ``index`` is the record's position in the file, ``record_id`` its ``_id`` when readable and
    ``field`` the offending field, so a user can find the record in a large file.
    """

    def __init__(self, message: str, *, index: int, field: str, record_id: str | None = None) -> None:
        where = f"HotpotQA record {index}" + (f" (_id {record_id!r})" if record_id else "")
        super().__init__(f"{where}, field {field!r}: {message}")
        self.index = index
        self.field = field
        self.record_id = record_id
