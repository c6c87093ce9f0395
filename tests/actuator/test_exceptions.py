"""One exception tree (issue 52): every public exception class of the package, outside
``controllers`` (which imports nothing of ours), is an ``ActuatorError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

from actuator._exceptions import ActuatorError


def exceptions_outside_the_tree(packages: tuple[str, ...]) -> list[str]:
    """Exception classes defined in ``packages`` (every module, private ones too) that do not
    subclass ``ActuatorError``, as ``module.Class``."""
    found = []
    for package in packages:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            if info.name.startswith(("actuator.migrations", "actuator.controllers")) or info.name.endswith(
                    ("__main__", "._synthetic")):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
                        and not issubclass(obj, ActuatorError)):
                    found.append(f"{module.__name__}.{name}")
    return sorted(found)


def test_every_exception_actuator_defines_is_in_the_tree():
    assert exceptions_outside_the_tree(("actuator", "actuator.agents", "actuator.api")) == []


def test_the_check_finds_an_exception_outside_the_tree(monkeypatch):
    from actuator.agents import knobs

    class Stray(RuntimeError):
        pass

    Stray.__module__ = knobs.__name__
    monkeypatch.setattr(knobs, "Stray", Stray, raising=False)
    assert exceptions_outside_the_tree(("actuator.agents",)) == ["actuator.agents.knobs.Stray"]


@pytest.mark.parametrize("path,name,builtin", [
    ("actuator.store", "ObservationRefused", ValueError),
    ("actuator.store", "RunTokenRefused", PermissionError),
    ("actuator.agents.probes", "ProbeDataNotFoundError", FileNotFoundError),
    ("actuator.agents.knobs", "KnobNotSupported", RuntimeError),
])
def test_names_import_paths_and_builtin_bases_are_kept(path, name, builtin):
    cls = getattr(importlib.import_module(path), name)
    assert issubclass(cls, ActuatorError) and issubclass(cls, builtin)
