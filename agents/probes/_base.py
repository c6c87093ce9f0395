"""The probe contract: a name, a schedule, a size that can be subsampled, and ``measure``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ._common import probe_mode, subsample
from ._errors import ProbeSetupError

__all__ = ["Probe", "DefaultEvery"]


class DefaultEvery(int):
    """A probe's built-in interval (``every=DefaultEvery(50)`` in its signature): an ``int`` that
    remembers nobody chose it, so a preset's schedule may replace it while a user's ``every=``
    (a plain int, or None) is kept."""

    def __repr__(self) -> str:
        return int.__repr__(self)


class Probe(ABC):
    """One capability measurement taken on held-out data.

    Subclasses implement ``_measure``; the public ``measure`` wraps it in ``probe_mode`` (no
    grad, eval mode, train modes and RNG states restored) for the model and every auxiliary
    model the probe touches (``aux_models``: a teacher, a frozen reference), so a probe is
    safe to call directly as well as from a ``ProbeSuite``.

    Class attributes a subclass may override:

    * ``cost_rank``: forward-pass-equivalents per example, used to order probes before their
      real cost has been measured (cheap first).
    * ``min_examples``: below this many examples a subsampled value is too noisy to report, so
      the suite skips the probe instead.

    ``every_given`` is False while ``every`` is the class's built-in default (``DefaultEvery``):
    only then does a preset's interval replace it.
    """

    name: str = "probe"
    every: int | None = None
    on_evaluate: bool = True
    cost_rank: int = 1
    min_examples: int = 1
    # A probe that never called _init_schedule set its schedule itself: treat it as chosen.
    every_given: bool = True
    # for_preset builds it from the trainer's tokenizer: a trainer without one is told so first.
    preset_needs_tokenizer: bool = True

    def _init_schedule(self, every: int | None, on_evaluate: bool) -> None:
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 1):
            raise ValueError(f"{type(self).__name__}: every must be a positive int or None, got {every!r}")
        self.every_given = not isinstance(every, DefaultEvery)
        self.every = None if every is None else int(every)
        self.on_evaluate = bool(on_evaluate)

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> Probe:
        """This probe built from shipped held-out data and the trainer's ``tokenizer``, sized for the
        probe budget, for a preset that names it and a run that did not pass it (``reference``: the
        trainer's reference model, ``teacher``: its teacher, either may be None). Raises
        ``ProbeSetupError`` saying what to pass when it cannot be built here; by default it cannot."""
        raise ProbeSetupError(f"{cls.name}: no shipped data to build it from; pass probes=[{cls.__name__}(...)]")

    def setup(self, model: Any) -> None:  # noqa: B027 - an optional hook, not abstract
        """Called once at train begin with the model being trained. Default: nothing."""

    def due(self, step: int) -> bool:
        """True on steps that are multiples of ``every`` (step 0 included: the baseline)."""
        return bool(self.every) and step % self.every == 0  # None or 0: never by step

    @property
    def num_examples(self) -> int | None:
        """How many examples a full measurement uses (``None``: not subsampleable)."""
        return None

    def aux_models(self) -> tuple[Any, ...]:
        """Other modules ``measure`` runs (teacher, frozen reference), for the safety wrapper."""
        return ()

    def measure(
        self, model: Any, *, step: int | None = None, max_examples: int | None = None
    ) -> dict[str, float]:
        """Measure ``model``; ``max_examples`` caps the examples used (evenly spaced subset)."""
        if max_examples is not None and max_examples < 1:
            raise ValueError(f"max_examples must be >= 1 or None, got {max_examples}")
        with probe_mode(model, *self.aux_models()):
            values = self._measure(model, max_examples=max_examples)
        return {key: float(value) for key, value in values.items()}

    @abstractmethod
    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        """The measurement itself; runs inside ``probe_mode``."""

    def _selection(self, n: int, max_examples: int | None) -> list[int]:
        return subsample(n, max_examples)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, every={self.every}, on_evaluate={self.on_evaluate})"
