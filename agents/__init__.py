"""The training side of Actuator: the ``Trainer`` callback, the KL anchor and the probes.

    from actuator.agents import ActuatorCallback, KLAnchor, install_anchor, Perplexity

The names below are loaded on first use (PEP 562), so ``import actuator.agents`` (and a submodule
such as ``actuator.agents.sender``) does not import torch or transformers: a training node brings
those itself, and asking for a name that needs them without them names what to install. Each name
is the object of its home module (``actuator.agents.callback``, ``.session``, ``.anchor``, ``.probes``); the
rest of the training side (knob setters, compression, distillation, the sender) is imported from
its module.

The probe classes are not listed here: every probe registered in this package
(``actuator.agents.probes.register``) is exported under its class name, so ``__all__`` is computed
when first asked for (it imports the probes, hence torch); ``dir()`` stays light and lists the
probes once they are loaded.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# name -> the submodule (relative to this package) that defines it.
_HOMES = {
    "ActuatorCallback": ".callback",
    **dict.fromkeys(("ControlSession", "Connection", "RunInfo", "Reporting", "Protect", "TrainerParts"),
                    ".session"),
    **dict.fromkeys(("KLAnchor", "KLAnchorKnob", "KLAnchorMixin", "KLAnchorCallback", "anchor_trainer",
                     "install_anchor", "pair_token_ids"), ".anchor"),
    **dict.fromkeys(("Probe", "ProbeSuite", "ProbeReport", "ProbeError"), ".probes"),
}


def _probes() -> dict[str, Any]:
    """The registered probe classes of this package, by class name (imports them)."""
    return import_module(".probes._registry", __name__).exported()


def __getattr__(name: str) -> Any:
    if name == "__all__":
        names = [*_HOMES, *(n for n in sorted(_probes()) if n not in _HOMES)]
        globals()["__all__"] = names
        return names
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(import_module(home, __name__), name)
    elif name[:1].isupper() and (value := _probes().get(name)) is not None:
        pass
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    # without importing the probes: those already exported are in globals()
    return sorted(set(globals()) | set(_HOMES))
