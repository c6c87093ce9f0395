"""The knob and probe catalogue: the one place a knob or a probe is defined.

For each **knob**: its default bounds (around the value the run starts with), scale, largest change
per decision, and what it is. For each **probe** (an observation key a shipped probe produces):
the values it can take, whether higher is better, whether it measures drift, and the shipped
probe (``probes[].name``) that produces it.

Everything else is derived from here: the policy's known knobs and probes and their ranges
(``actuator.policy``), the bounds a knob named without bounds gets (:func:`default_knob_spec`),
and the docs tables (docs/reference/knobs-and-probes.md, checked by
tests/actuator/test_catalogue.py). The agent's setters register by knob name beside their code
(``actuator.agents.knobs.knob_setter``); the agent's probes register their class, the keys it
produces and how a preset builds it (``actuator.agents.probes.register``).

**Entries beyond the shipped ones travel.** A knob or probe key registered in the agent's process
only (a ``@knob_setter(Knob(...))``, a probe of your own) is unknown to a service in another
process. :func:`travelling` lists them; the agent sends them with the run's registration
(``RunCreate.catalogue``) and the service validates that run's policy with them beside its own
entries (:func:`declared`, for the block that validates).

:class:`Bounds` is a knob's bounds, scale and rate limit: what a knob's defaults give around a
starting value (:meth:`Knob.bounds`) and what :func:`limit` reads. :func:`limit` is the one clamp a
knob value goes through before it is applied or ordered: bounds, rate limit in the knob's scale,
integer rounding (controllers/limits.py, shared with the PID).

Standard library only (and ``controllers``): the service, the agent and the docs read it alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Generic, Literal, Protocol, TypeVar

from .controllers.limits import KnobLimits

__all__ = [
    "Rel",
    "Bounds",
    "Bounded",
    "Knob",
    "Probe",
    "TrainSignal",
    "KNOBS",
    "TRAIN_SIGNALS",
    "PROBES",
    "register_knob",
    "register_probe",
    "default_knob_spec",
    "declared",
    "travelling",
    "limit",
]

ScaleName = Literal["linear", "log", "integer"]


@dataclass(frozen=True)
class Rel:
    """A bound relative to the knob's starting value: ``value * factor``."""

    factor: float

    def at(self, value: float) -> float:
        return value * self.factor

    def __str__(self) -> str:
        if self.factor == 1:
            return "value"
        if self.factor < 1:
            return f"value / {_num(1 / self.factor)}"
        return f"value × {_num(self.factor)}"


def _num(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Bounds:
    """A knob's bounds ``[min, max]`` (knob units), its ``scale`` and ``max_step``, the largest
    change per decision in that scale (log units for ``log``; None: unlimited). The one form bounds
    take from the catalogue to the agent: :meth:`Knob.bounds` gives it, :func:`limit` reads it (or
    the same four fields of a run's knob: the wire's ``KnobSpec``, the engine's ``KnobState``)."""

    min: float
    max: float
    scale: ScaleName = "linear"
    max_step: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The four fields by name, as ``KnobSpec`` takes them beside ``name`` and ``value``."""
        return asdict(self)


class Bounded(Protocol):
    """What :func:`limit` reads: :class:`Bounds`' four fields (a ``Bounds``, a ``KnobSpec``, a
    ``KnobState``: each has them as attributes)."""

    @property
    def min(self) -> float: ...
    @property
    def max(self) -> float: ...
    @property
    def scale(self) -> str: ...
    @property
    def max_step(self) -> float | None: ...


@dataclass(frozen=True)
class Knob:
    """A knob's defaults. ``min`` / ``max`` are absolute or :class:`Rel` to the starting value (a
    relative ``max`` is never below ``min``: rank 1..max(1, value)). A log-scale knob needs a
    starting value > 0; at 0 or below it gets the pinned default (see :func:`default_knob_spec`)."""

    name: str
    min: float | Rel
    max: float | Rel
    scale: ScaleName
    max_step: float | None
    what: str = ""

    @property
    def integer(self) -> bool:
        return self.scale == "integer"

    def bounds(self, value: float) -> Bounds:
        """The bounds a run gets for this knob when it starts at ``value``."""
        if self.scale == "log" and not value > 0:
            return _pinned(value)
        lo = self.min.at(value) if isinstance(self.min, Rel) else float(self.min)
        hi = self.max.at(value) if isinstance(self.max, Rel) else float(self.max)
        if isinstance(self.max, Rel):
            hi = max(lo, hi)
        return Bounds(lo, hi, self.scale, self.max_step)

    def spec(self, value: float) -> dict[str, Any]:
        """:meth:`bounds` as the fields a ``KnobSpec`` takes."""
        return self.bounds(value).as_dict()


@dataclass(frozen=True)
class Probe:
    """An observation key a shipped probe produces. ``range`` is what the value can be (a
    setpoint or threshold outside it can never be met); ``higher_is_better`` decides which side
    ``protect=`` guards; ``drift`` probes get the ``on_drift`` action; ``source`` is the
    ``probes[].name`` that produces the key (None: a knob setter reports it)."""

    name: str
    range: tuple[float, float]
    higher_is_better: bool
    drift: bool
    source: str | None
    what: str = ""


@dataclass(frozen=True)
class TrainSignal:
    """A metric the trainer itself logs at every optimizer step, named ``train.<metric>`` in a
    policy (TRL's ``/`` becomes ``.``: ``clip_ratio/high_mean`` -> ``train.clip_ratio.high_mean``).
    It costs no probe run: the agent sends it with each step's log. ``per`` says what it averages
    over (``token``, ``sequence`` or ``batch``); ``trainers`` which TRL trainers log it; ``filter``
    the filter a controller on it should use against every-step noise (a policy ``filter:``)."""

    name: str
    range: tuple[float, float]
    higher_is_better: bool
    per: Literal["token", "sequence", "batch"]
    trainers: tuple[str, ...]
    filter: str
    what: str = ""


_LOG2 = math.log(2.0)

_E = TypeVar("_E")


class _Entries(MutableMapping[str, _E], Generic[_E]):
    """The process's entries (registered here), then the entries a run declared for the block that
    validates its policy (:func:`declared`): a name the process knows keeps its own definition."""

    def __init__(self, overlay: ContextVar[Mapping[str, _E]]) -> None:
        self._own: dict[str, _E] = {}
        self._overlay = overlay

    def __getitem__(self, name: str) -> _E:
        try:
            return self._own[name]
        except KeyError:
            return self._overlay.get()[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._own
        yield from (name for name in self._overlay.get() if name not in self._own)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __setitem__(self, name: str, entry: _E) -> None:
        self._own[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._own[name]

    def own(self) -> dict[str, _E]:
        """The process's entries only."""
        return dict(self._own)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({sorted(self)})"


_NONE: Mapping[str, Any] = MappingProxyType({})
_DECLARED_KNOBS: ContextVar[Mapping[str, Knob]] = ContextVar("declared_knobs", default=_NONE)
_DECLARED_PROBES: ContextVar[Mapping[str, Probe]] = ContextVar("declared_probes", default=_NONE)
KNOBS: _Entries[Knob] = _Entries(_DECLARED_KNOBS)
PROBES: _Entries[Probe] = _Entries(_DECLARED_PROBES)
TRAIN_SIGNALS: dict[str, TrainSignal] = {}


def register_knob(knob: Knob) -> Knob:
    """Add a knob to the catalogue (the shipped ones are below; a test or an extension may add
    its own). Registering a name twice with a different definition is an error."""
    known = KNOBS.get(knob.name)
    if known is not None and known != knob:
        raise ValueError(f"knob {knob.name!r} is already in the catalogue as {known}")
    KNOBS[knob.name] = knob
    return knob


def register_probe(probe: Probe) -> Probe:
    """Add a probe (an observation key) to the catalogue."""
    known = PROBES.get(probe.name)
    if known is not None and known != probe:
        raise ValueError(f"probe {probe.name!r} is already in the catalogue as {known}")
    PROBES[probe.name] = probe
    return probe


for _knob in (
    # The learning rate the user configured is its ceiling: a controller may slow a run down to
    # protect a capability but never, by default, train faster than the user chose (a 10x lr is
    # how runs diverge).
    Knob("learning_rate", Rel(0.01), Rel(1.0), "log", 0.7,
         "the optimizer's learning rate (a LambdaLR schedule's peak)"),
    # Betas may rise 10x (a larger beta keeps the policy closer to its reference, the conservative
    # direction) and fall 100x.
    Knob("kl_beta", Rel(0.01), Rel(10.0), "log", 0.7, "TRL DPO / GRPO / RLOO `trainer.beta`"),
    Knob("distill_lambda", 0.0, 1.0, "linear", 0.2, "weight of the distillation term against cross-entropy"),
    # GKD's beta interpolates forward and reverse KL (a share in [0, 1]), not a multiplier.
    Knob("gkd_beta", 0.0, 1.0, "linear", 0.2, "TRL GKD's forward/reverse KL interpolation"),
    Knob("onpolicy_fraction", 0.0, 1.0, "linear", 0.2, "share of on-policy (student-generated) batches"),
    Knob("divergence_mix", 0.0, 1.0, "linear", 0.2,
         "where the distillation divergence sits on its path (forward KL → TV: TV's share, or λ of KL + λ·TV)"),
    # AdaSPEC drops the tokens a draft-sized reference fits no better than the draft; beyond 0.9
    # almost nothing is left to distil. 0.1 per decision.
    Knob("distill_token_filter", 0.0, 0.9, "linear", 0.1,
         "fraction of tokens dropped from the distillation divergence (AdaSPEC, against a reference model)"),
    # T acts multiplicatively on the logits: a factor 4 either way, at most x1.5 per decision.
    Knob("distill_temperature", Rel(0.25), Rel(4.0), "log", 0.4, "distillation temperature"),
    # A Lagrange multiplier: 0 is "anchor off"; at 2 the anchor already outweighs a typical task
    # loss (forgetting benchmark: w = 3 costs a third of the task); 0.25 per decision.
    Knob("kl_weight", 0.0, 2.0, "linear", 0.25, "weight of the KL anchor's restoring term"),
    # TRL GRPO's entropy bonus (loss - coef * entropy). TRL's adaptive law moves it by 0.005 a
    # step inside [0, 1]; 0.01 a decision here, up to 0.1 (past that the bonus outweighs a
    # normalised advantage and the policy walks to uniform).
    Knob("entropy_coef", 0.0, 0.1, "linear", 0.01, "TRL GRPO `trainer.entropy_coef` (the entropy bonus)"),
    Knob("rank", 1.0, Rel(1.0), "integer", None, "active rank of factorised layers or LoRA adapters"),
    # A threshold on sensitivities, which span decades: log scale, at most x2 per decision.
    # ThresholdKnob's own bounds (the sensitivities' range) replace min and max.
    Knob("compression_threshold", Rel(1e-6), Rel(1e6), "log", _LOG2,
         "threshold on the factorised components' sensitivities (sets each layer's rank)"),
    # Channel importances are bunched: on SmolLM2, x1.8 of tau goes from 99% to 85% of the dense
    # parameters, so at most x1.05 per decision (~1.5% of the parameters). The setter's bounds
    # (the importances' range) replace min and max.
    Knob("mlp_channel_threshold", Rel(1e-6), Rel(1e6), "log", math.log(1.05),
         "threshold on MLP channels' importance (structured width pruning)"),
):
    register_knob(_knob)

_INF = math.inf
for _probe in (
    Probe("perplexity", (1.0, _INF), False, False, "perplexity", "perplexity on held-out text"),
    Probe("kl_drift", (0.0, _INF), False, True, "kl_drift", "KL(current ‖ starting model) on held-out text"),
    Probe("answer_kl", (0.0, _INF), False, True, "answer_kl", "KL(reference ‖ current) over the first tokens of the reference's own answers"),
    Probe("policy_kl", (0.0, _INF), False, True, "policy_kl", "KL(current ‖ reference) over the current model's own sampled answers"),
    Probe("embedding_drift", (0.0, 2.0), False, True, "embedding_drift",
          "1 − cosine of current vs reference greedy answers' embeddings"),
    Probe("answer_agreement", (0.0, 1.0), True, False, "embedding_drift",
          "share of greedy answers identical to the reference's"),
    Probe("hotpotqa.em", (0.0, 1.0), True, False, "hotpotqa", "HotpotQA exact match"),
    Probe("hotpotqa.f1", (0.0, 1.0), True, False, "hotpotqa", "HotpotQA token F1"),
    Probe("hotpotqa.gold_logprob", (-_INF, 0.0), True, False, "hotpotqa", "mean log-prob of the gold answer"),
    Probe("draft.acceptance", (0.0, 1.0), True, False, "draft", "speculative decoding draft acceptance rate α"),
    Probe("draft.tokens_per_call", (1.0, _INF), True, False, "draft", "tokens per target-model call, (1 − α^(γ+1)) / (1 − α)"),
    Probe("compression.params", (-_INF, _INF), False, False, None,
          "parameters of the model in effect (reported by the compression knobs' setters)"),
):
    register_probe(_probe)


# What TRL 1.16 logs at each optimizer step (trl/trainer/grpo_trainer.py, rloo_trainer.py,
# dpo_trainer.py `_metrics`), already reduced over micro-batches and ranks for that step. EMA 0.3:
# on GRPO's logged kl at lr 3e-5 (0.30-1.48 over nine steps) it keeps a third of a step's jump.
_RL = ("GRPOTrainer", "RLOOTrainer")
for _signal in (
    TrainSignal("train.entropy", (0.0, _INF), True, "token", _RL, "ema 0.3",
                "mean per-token entropy of the policy on its own completions (nats)"),
    TrainSignal("train.kl", (0.0, _INF), False, "token", _RL, "ema 0.3",
                "mean per-token KL(policy ‖ reference) on the completions (logged only when beta > 0)"),
    TrainSignal("train.clip_ratio.low_mean", (0.0, 1.0), False, "token", _RL, "ema 0.3",
                "share of tokens clipped at 1 − epsilon with a negative advantage"),
    TrainSignal("train.clip_ratio.high_mean", (0.0, 1.0), False, "token", _RL, "ema 0.3",
                "share of tokens clipped at 1 + epsilon_high with a positive advantage"),
    TrainSignal("train.clip_ratio.region_mean", (0.0, 1.0), False, "token", _RL, "ema 0.3",
                "share of tokens in the clipped region"),
    TrainSignal("train.reward", (-_INF, _INF), True, "sequence", _RL, "ema 0.3",
                "mean reward of the step's completions"),
    TrainSignal("train.reward_std", (0.0, _INF), True, "sequence", _RL, "ema 0.3",
                "standard deviation of the step's rewards (0: nothing left to learn from)"),
    TrainSignal("train.completions.mean_length", (0.0, _INF), False, "sequence", _RL, "ema 0.3",
                "mean completion length (tokens)"),
    TrainSignal("train.rewards.margins", (-_INF, _INF), True, "sequence", ("DPOTrainer",), "ema 0.3",
                "DPO's mean implicit reward margin, beta × (chosen − rejected log-ratio)"),
    TrainSignal("train.loss", (-_INF, _INF), False, "batch",
                ("Trainer", "SFTTrainer", "DPOTrainer", "GRPOTrainer", "RLOOTrainer"), "ema 0.3",
                "the training loss logged for the step"),
):
    TRAIN_SIGNALS[_signal.name] = _signal

# What this version ships: the rest was registered in this process and travels with a run.
_SHIPPED_KNOBS = dict(KNOBS.own())
_SHIPPED_PROBES = dict(PROBES.own())


def travelling() -> tuple[list[Knob], list[Probe]]:
    """The knobs and probe keys registered in this process beyond the shipped ones (or shipped
    under another definition): what a run must declare for a service that only ships the rest."""
    return ([k for name, k in KNOBS.own().items() if _SHIPPED_KNOBS.get(name) != k],
            [p for name, p in PROBES.own().items() if _SHIPPED_PROBES.get(name) != p])


@contextmanager
def declared(knobs: Iterable[Knob] = (), probes: Iterable[Probe] = ()) -> Iterator[None]:
    """Inside the block (this thread or task only), :data:`KNOBS` and :data:`PROBES` also hold
    these entries: a run's declared catalogue while its policy is validated. A name the process
    has keeps the process's definition (the service checks a run's declarations against it)."""
    tokens = (_DECLARED_KNOBS.set({**_DECLARED_KNOBS.get(), **{k.name: k for k in knobs}}),
              _DECLARED_PROBES.set({**_DECLARED_PROBES.get(), **{p.name: p for p in probes}}))
    try:
        yield
    finally:
        _DECLARED_PROBES.reset(tokens[1])
        _DECLARED_KNOBS.reset(tokens[0])


def default_knob_spec(name: str, value: float) -> dict[str, Any]:
    """Bounds a user gets when they name a knob without bounds, as a ``KnobSpec``'s fields
    (:meth:`Bounds.as_dict`). A knob the catalogue does not know (or a log-scale knob starting at 0
    or below) is pinned at ``value``."""
    knob = KNOBS.get(name)
    return (knob.bounds(value) if knob is not None else _pinned(value)).as_dict()


def _pinned(value: float) -> Bounds:
    return Bounds(value, value, "linear", None)


def limit(spec: Bounded, current: float | None, ordered: float, limits: set[str] | None = None) -> float:
    """``ordered`` made safe to apply to a knob now at ``current``: inside ``[spec.min, spec.max]``,
    within ``spec.max_step`` of ``current`` in the knob's scale (``current=None``: no rate window;
    none either when ``current`` is not finite or, on a log scale, not > 0), inside the bounds
    again (bounds win), then rounded to the nearest integer (halves up, kept inside the bounds and
    the rate window) for an integer knob. The limits that acted (``"bounds"``, ``"rate"``,
    ``"integer"``) are added to ``limits``. The PID clamps its output with the same code."""
    lim = KnobLimits(float(spec.min), float(spec.max), str(spec.scale), spec.max_step)
    return lim.limit(current, float(ordered), limits)
