"""The training side of Actuator: the ``Trainer`` callback, the KL anchor and the probes.

    from actuator.agents import ActuatorCallback, KLAnchor, install_anchor, Perplexity

The names below are loaded on first use (PEP 562), so ``import actuator.agents`` (and a submodule
such as ``actuator.agents.sender``) does not import torch or transformers: a training node brings
those itself, and asking for a name that needs them without them names what to install. Each name
is the object of its home module (``actuator.agents.callback``, ``.session``, ``.anchor``, ``.probes``); the
rest of the training side (knob setters, compression, distillation, the sender) is imported from
its module.
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
    **dict.fromkeys(("Probe", "ProbeSuite", "ProbeReport", "ProbeError", "Perplexity", "KLDrift", "AnswerKL",
                     "PolicyKL", "EmbeddingDrift", "HotpotQA", "DraftAcceptance"), ".probes"),
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value  # the next lookup is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
