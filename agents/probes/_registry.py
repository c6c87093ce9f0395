"""Where a probe is declared: one registration beside its class.

``@register()`` on a :class:`~actuator.agents.probes.Probe` subclass gives, from that one place:

* **the catalogue keys** it produces (``actuator.catalogue.PROBES``, what a policy may name):
  ``register(Key("weight_norm", (0.0, inf), False, False, "weight_norm", "..."))`` adds them; the
  shipped probes' keys are in ``actuator/catalogue.py`` already (a service without torch reads them
  there), so their registration names none. Keys registered here only travel with the run's
  registration (``actuator.catalogue.travelling``), so a service in another process accepts them;
* **the builder presets use**: the class's ``for_preset(tokenizer, reference=, teacher=)``
  (:func:`build`; ``actuator.agents.default_probes.build_probe``);
* **the face export**: ``from actuator.agents import WeightNorm`` for a probe that lives in this
  package (``actuator.agents.__init__`` asks :func:`exported`);
* **the docs rows the agreement test checks**: tests/actuator/test_catalogue.py reads
  :func:`registered`, not a list of classes.

Every module of this package is imported by :func:`registered` (a new ``_weight_norm.py`` needs
no import added anywhere).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from actuator.catalogue import PROBES
from actuator.catalogue import Probe as Key
from actuator.catalogue import register_probe as register_key

from ..general import chat
from ._base import Probe
from ._errors import ProbeSetupError

__all__ = ["Registration", "register", "registered", "build", "exported", "chat_prompts", "Key"]

P = TypeVar("P", bound=type[Probe])

# Modules of the package that are not imported to find probes (a script run as __main__).
_NOT_IMPORTED = ("_synthetic",)


@dataclass(frozen=True)
class Registration:
    """A registered probe: its class and the observation keys it produces (catalogue names)."""

    cls: type[Probe]
    keys: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.cls.name


_REGISTRY: dict[str, Registration] = {}


def register(*keys: Key) -> Callable[[P], P]:
    """Register the decorated probe class under its ``name`` (``probes[].name``), with ``keys``:
    catalogue entries of the observation keys it produces that the catalogue does not have yet
    (each with ``source`` = the class's ``name``). A probe producing no catalogued key is an error,
    and so is a second class under a registered name."""

    def decorate(cls: P) -> P:
        name = cls.name
        for key in keys:
            if key.source != name:
                raise ValueError(f"probe {name!r}: key {key.name!r} names source {key.source!r}, not {name!r}")
            register_key(key)
        own = tuple(k for k, entry in PROBES.own().items() if entry.source == name)
        if not own:
            raise ValueError(f"probe {name!r}: no catalogue key has source {name!r}; pass the keys it produces "
                             f"(register(Key(...)))")
        known = _REGISTRY.get(name)
        if known is not None and known.cls.__qualname__ != cls.__qualname__:
            raise ValueError(f"probe {name!r} is already registered as {known.cls.__module__}.{known.cls.__qualname__}")
        _REGISTRY[name] = Registration(cls, own)
        return cls

    return decorate


def _load() -> None:
    package = __name__.rpartition(".")[0]
    for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if module.name not in _NOT_IMPORTED:
            importlib.import_module(f"{package}.{module.name}")


def registered() -> dict[str, Registration]:
    """Every registered probe by name (the package's modules imported first)."""
    _load()
    return dict(_REGISTRY)


def exported() -> dict[str, type[Probe]]:
    """The registered probe classes that live in ``actuator.agents``, by class name: the face
    export (``from actuator.agents import Perplexity``)."""
    return {r.cls.__name__: r.cls for r in registered().values() if r.cls.__module__.startswith("actuator.agents.")}


def chat_prompts(tokenizer: Any, prompts: list[str]) -> list[str]:
    """``prompts`` through the tokenizer's chat template when it has one: drift is measured where
    the model is used (a preset's builder)."""
    if getattr(tokenizer, "chat_template", None):
        return [chat(tokenizer, p) for p in prompts]
    return list(prompts)


def build(name: str, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> Probe:
    """The probe registered as ``name``, built for a preset (its ``for_preset``). Raises
    :class:`ProbeSetupError` saying what to pass when none is registered or it cannot be built."""
    registration = registered().get(name)
    if registration is None:
        raise ProbeSetupError(f"{name}: not a registered probe (registered: {sorted(_REGISTRY)}); pass it in "
                              "probes=[...]")
    if registration.cls.preset_needs_tokenizer and (tokenizer is None or not callable(tokenizer)):
        raise ProbeSetupError(f"{name}: the trainer has no tokenizer (processing_class) to build it with; pass "
                              f"processing_class= to the trainer")
    return registration.cls.for_preset(tokenizer, reference=reference, teacher=teacher)
