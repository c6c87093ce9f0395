"""ControlSession: one training run under control, whatever runs the training loop.

The session owns the run's lifecycle, one ordered sequence for every trainer: the ``Trainer``
callback (``ActuatorCallback``, agents/callback.py) is a thin adapter that calls it from the
trainer's events, and a loop of your own calls it directly:

    session = ControlSession(policy, setters=[LearningRateKnob(optimizer, scheduler)],
                             knobs={"learning_rate": {"min": 1e-5, "max": 3e-3, "max_step": 0.7}},
                             probes=[KLDrift(prompts, tok, every=10)], connection=Connection(url))
    session.begin(model, max_steps=steps)     # start: open, agree, bind, identify, (resume), register,
                                              # share, start (probes set up, the baseline read)
    for step in range(1, steps + 1):
        ...                                   # forward, backward, optimizer.step(), scheduler.step()
        if session.step(step, model, metrics={"loss": loss}).halt:   # apply, rewind, probe, send
            break
        # session.checkpoint_saved(step, path) after saving one (see TrainerParts.load for rewinds)
    session.finish()                          # delivers what is buffered, marks the run finished

=====================  ============================  ====================================
phase                  session method                the callback's hook
=====================  ============================  ====================================
start                  ``begin(model, parts=...)``   ``on_train_begin``
step, apply, probe     ``step(step, model)``         ``on_step_end``
log, evaluate          ``logged`` / ``evaluated``    ``on_log`` / ``on_evaluate``
checkpoint             ``checkpoint_saved``          ``on_save``
rewind (rollback)      ``rewind`` (from ``step``)    (``on_step_end``)
resume                 ``resume`` (from ``begin``)   (``on_train_begin``, from the checkpoint)
finish                 ``finish``                    ``on_train_end``
=====================  ============================  ====================================

What differs between trainers is what they hand the session (:class:`TrainerParts`: setters,
the policy's last word, an anchor, probe sources, the resume point, checkpoint save and load).
One rule for collectives: whenever more than one process trains (torch.distributed initialised
with a world size over 1: DDP, FSDP2, DeepSpeed), every rank calls the same methods and rank 0's
word (knobs, refusals, the identification plan, decisions, checkpoints, rewinds) is broadcast.

Every decision goes through the same guard (the run's bounds and rate limit, on this side too)
and is acknowledged with the value the setter read back, or set aside with the reason.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from actuator._exceptions import ConfigError, NotFound, RequestRejected, ServiceUnavailable
from actuator.catalogue import default_knob_spec, limit
from actuator.client import ActuatorClient
from actuator.policy import PolicyDocument, load_policy, load_preset
from actuator.schemas import (DecisionAck, DecisionPublic, IdentificationWindow, IngestResult, KnobSpec,
                              ObservationCreate, RunCreate, CatalogueSpec)

from .identification import IdentificationMode, auto_controller, schedule_steps, warmup_test
from .knobs import KnobSetter
from .preflight import check_url, late_first_decisions, ramp_beyond_run
from .sender import BackgroundSender, Resync
from .sharded import check_on_every_rank, from_rank0, is_fully_sharded, rank_and_world

__all__ = ["Connection", "ControlSession", "ProbeSources", "Protect", "Received", "Reporting", "RunInfo", "StepOutcome",
           "TrainerParts", "metric_name", "policy_argument"]

log = logging.getLogger("actuator.agents")

# What the agent keeps of the decisions it applied, whatever the controller sends: the latest
# APPLIED_KEPT entries whole (reasons cut to REASON_KEPT characters), older ones folded into one
# summary per knob (``ControlSession.applied_summary``).
APPLIED_KEPT = 1000
REASON_KEPT = 200
# The lifecycle phases kept (ControlSession.phases): enough for a short run whole, bounded for a long one.
PHASES_KEPT = 10_000
# Beside a checkpoint, the run token (owner-only): a resume continues the same run.
TOKEN_FILE = "actuator-token"

PolicyArg = str | dict[str, Any] | PolicyDocument | os.PathLike[str]


# -- configuration objects -------------------------------------------------------------------------
class _Group:
    """Settings that belong together, built by :meth:`of` from themselves, a dict of their fields
    (a checkpoint's ``state()``), the one field a string stands for (``_alone``), or None."""

    _alone: ClassVar[str | None] = None

    @classmethod
    def of(cls, value: Any) -> Any:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and cls._alone is not None:
            return cls(**{cls._alone: value})
        return cls(**dict(value))


@dataclass(frozen=True)
class Connection(_Group):
    """Where the controller service is and how long the agent waits for it.

    ``url``: the service's base URL (default ``$ACTUATOR_URL`` or ``http://127.0.0.1:8000``).
    ``token``: admin token for registration when the service has one (default ``$ACTUATOR_TOKEN``).
    ``timeout``: the longest one request may take, in seconds, its whole answer included (the
    sender's, never training's): an answer slower than that is an outage, retried.
    ``register_timeout``: how long training may wait at its start for the registration's answer (a
    refusal stops training there; no answer in time lets it start without control).
    ``flush_timeout``: seconds to wait at the end for buffered observations.
    ``max_answer_bytes``: the largest answer the agent reads (2 MB; a full page of the service's
    1,000 decisions is well under it): a larger one is abandoned unread, an outage like no answer
    (counted in ``sender.stats.oversize``, warned, retried), so no controller can make the
    training process hold more.
    """

    url: str | None = None
    token: str | None = None
    timeout: float = 2.0
    register_timeout: float = 10.0
    flush_timeout: float = 10.0
    max_answer_bytes: int = 2_000_000

    _alone: ClassVar[str] = "url"

    def resolved(self) -> Connection:
        """With the environment's defaults filled in and the URL checked (a ConfigError now, not
        a whole run trained uncontrolled behind one "unreachable" line)."""
        url = check_url(self.url) if self.url else check_url(os.environ.get("ACTUATOR_URL", "http://127.0.0.1:8000"),
                                                             field="ACTUATOR_URL")
        if self.max_answer_bytes < 1024:
            raise ConfigError(f"connection.max_answer_bytes: at least 1024, got {self.max_answer_bytes}")
        return Connection(url, self.token or os.environ.get("ACTUATOR_TOKEN"), self.timeout,
                          self.register_timeout, self.flush_timeout, self.max_answer_bytes)

    def public(self) -> dict[str, Any]:
        """Every field but the token (a secret: never in a checkpoint's JSON)."""
        return {"url": self.url, "timeout": self.timeout, "register_timeout": self.register_timeout,
                "flush_timeout": self.flush_timeout, "max_answer_bytes": self.max_answer_bytes}


@dataclass(frozen=True)
class RunInfo(_Group):
    """What the run is called and what it carries: ``name`` (default: the trainer's ``run_name`` or
    output dir, else "run") and ``metadata`` (str, number, bool or None values are registered)."""

    name: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


    _alone: ClassVar[str] = "name"


@dataclass(frozen=True)
class Reporting(_Group):
    """What observing costs and how often it is sent: ``budget_share``, the largest share of wall
    time probes may take (10% by default; a ``ProbeSuite`` given as probes keeps its own), and
    ``report_every``, send training metrics every N steps without probes too (0: only with probes)."""

    budget_share: float = 0.10
    report_every: int = 0


@dataclass(frozen=True)
class Protect:
    """The one-line policy: ``Protect({"hotpotqa.gold_logprob": "-5%", "kl_drift": 0.1})`` builds
    one guardrail per probe; drift probes take ``on_drift`` (default ``adjust``), the others
    ``on_breach`` (default ``rollback``)."""

    budgets: Mapping[str, float | str]
    on_drift: str = "adjust"
    on_breach: str = "rollback"

    @classmethod
    def of(cls, value: Protect | Mapping[str, float | str]) -> Protect:
        return value if isinstance(value, Protect) else cls(dict(value))


def policy_argument(policy: PolicyArg) -> tuple[str | PolicyDocument, bool]:
    """``(policy, from_preset)``: a stored policy's name stays a name (fetched at the start); a
    preset or a document is loaded now (a PolicyError here, not mid-run)."""
    if isinstance(policy, PolicyDocument):
        return policy, False
    if isinstance(policy, str) and policy.startswith("preset:"):
        return load_preset(policy.removeprefix("preset:")), True
    if isinstance(policy, str) and "\n" not in policy and not policy.endswith((".yaml", ".yml", ".json")):
        return policy, False  # a stored policy on the service
    return load_policy(policy), False


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


def metric_name(key: str) -> str | None:
    """Trainer/TRL log keys as observation names: TRL logs 'rewards/margins', which becomes
    'rewards.margins'; a key that still is not a valid name is dropped (None)."""
    name = str(key).replace("/", ".")
    return name if _NAME.match(name) else None


def _setter_summary(setter: Any) -> dict[str, float]:
    """A setter's report of what is in effect beyond its value (``summary()``, optional): finite
    floats under valid observation names."""
    fn = getattr(setter, "summary", None)
    if fn is None:
        return {}
    try:
        values = fn()
    except Exception as exc:  # noqa: BLE001 - telemetry never stops training
        log.warning("actuator: knob %s: summary failed: %s", getattr(setter, "name", "?"), exc)
        return {}
    return {k: float(v) for k, v in values.items()
            if metric_name(k) == k and isinstance(v, (int, float)) and math.isfinite(v)}


@dataclass
class Received:
    """What the service's answers since the last step boundary ask for: new decisions (oldest
    first), a halt, a rollback."""

    decisions: list[DecisionPublic] = field(default_factory=list)
    halt: bool = False
    rollback: bool = False
    # why: the service's reasons for a halt or rollback (guardrail, reading, threshold), for the log
    why: list[str] = field(default_factory=list)


@dataclass
class StepOutcome:
    """What :meth:`ControlSession.step` did: the decisions applied there (``applied`` entries) and
    whether the controller stopped the run (``halt``: stop training)."""

    applied: list[dict[str, Any]]
    halt: bool


@dataclass
class ProbeSources:
    """What the probes a policy names but the run was not given are built from
    (``default_probes``): the trainer's tokenizer, its reference and teacher models."""

    tokenizer: Any = None
    reference: Any = None
    teacher: Any = None


# A run's checkpoints cannot be rolled back without a loader: why, as the warnings say it.
NO_LOADER = "nothing loads a checkpoint into this loop (no TrainerParts.load)"


@dataclass
class TrainerParts:
    """What a trainer hands the session's lifecycle; each part is optional. ``ActuatorCallback``
    builds one from the Hugging Face ``Trainer``; a loop of your own passes its setters to the
    session and usually needs none of this.

    ``setters(names)``: the setters of the knobs ``names`` that were not given (found from the
    trainer). ``policy_resolved()``: rank 0's last word on the policy, once a stored one is fetched
    and before its knobs are declared. ``anchor()``: every rank, once rank 0's knobs are agreed and
    before the setters are bound (a KL anchor put on the trainer). ``probe_sources``: build the
    probes the policy names that the run was not given. ``resume``: ``(attributes, checkpoint
    directory)`` of the checkpoint training resumes from. ``name``: the run's name when
    ``RunInfo`` gives none. ``before_start()``: rank 0's own checks before the first step.
    ``save(path)``: every rank, at each checkpoint (the trainer's own state beside it, e.g.
    sharded weights). ``load(path)``: every rank, at a rewind (the checkpoint into the live
    trainer). ``no_rollback``: why this run cannot be rolled back even with ``load``.
    ``saves_checkpoints``: whether checkpoints are saved at all (and one is saved at a halt)."""

    setters: Callable[[list[str]], Mapping[str, KnobSetter]] | None = None
    policy_resolved: Callable[[], None] | None = None
    anchor: Callable[[], None] | None = None
    probe_sources: ProbeSources | None = None
    resume: tuple[Mapping[str, Any], str] | None = None
    name: str | None = None
    before_start: Callable[[], None] | None = None
    save: Callable[[str], None] | None = None
    load: Callable[[str], None] | None = None
    no_rollback: str | None = None
    saves_checkpoints: bool = False
    no_saves: str | None = None

    def rollback_blocked(self, own_saves: bool = False) -> str | None:
        """Why a rollback cannot happen in this run (None: it can, given a healthy checkpoint).
        ``own_saves``: the agent saves checkpoints of its own (the policy's ``rewind.healthy_saves``),
        so the trainer saving none (``no_saves``) does not stop it."""
        return self.no_rollback or (None if own_saves else self.no_saves) or (NO_LOADER if self.load is None else None)


class ControlSession:
    """One run under control on the training side.

    Args:
        policy: a stored policy's name (``"sft-drift"`` or ``"sft-drift@3"``), a shipped preset
            (``"preset:sft-capability"``), or a policy document (dict, YAML/JSON path,
            :class:`PolicyDocument`) registered with the run.
        setters: the knobs' setters (``KnobSetter``: ``name``, ``read()``, ``apply(value)``).
        knobs: bounds per knob, ``{"learning_rate": {"min": 1e-6, "max": 1e-3, "max_step": 0.5}}``;
            a knob without bounds gets the catalogue's defaults around its value. Default: one
            entry per setter.
        probes: a list of probes or a ``ProbeSuite`` (``actuator.agents.probes``).
        connection: a :class:`Connection` (or its URL).
        run: a :class:`RunInfo` (or the run's name).
        reporting: a :class:`Reporting` (probe budget, metrics cadence).
        identify: an identification pre-run (:class:`IdentificationMode` or its dict).
    """

    def __init__(
        self,
        policy: str | PolicyArg,
        *,
        setters: Iterable[KnobSetter] = (),
        knobs: Mapping[str, Mapping[str, Any]] | None = None,
        probes: Any = None,
        connection: Connection | Mapping[str, Any] | str | None = None,
        run: RunInfo | Mapping[str, Any] | str | None = None,
        reporting: Reporting | Mapping[str, Any] | None = None,
        identify: IdentificationMode | dict[str, Any] | None = None,
    ) -> None:
        self.policy, self.from_preset = policy_argument(policy)
        self.connection = Connection.of(connection).resolved()
        self.extra_setters: dict[str, KnobSetter] = {s.name: s for s in setters}
        self.knob_bounds: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (
            knobs if knobs is not None else {name: {} for name in self.extra_setters}).items()}
        info = RunInfo.of(run)
        self.run_name, self.metadata = info.name, dict(info.metadata)
        self.reporting = Reporting.of(reporting)
        self.identification = IdentificationMode.from_config(identify) if identify is not None else None
        # gains auto: the warm-up step test declared at registration, and whether the service took it
        self.auto_window: IdentificationWindow | None = None
        self.auto_accepted = False
        # the plan is fixed once the registration at the start has answered (or not): a later one,
        # from the sender's thread, no longer changes it (every rank runs the plan fixed there)
        self.plan_fixed = False
        if self.identification is not None:
            self.knob_bounds.setdefault(self.identification.knob, {})
        self.suite = self._make_suite(probes, self.reporting.budget_share)
        # run-time state
        self.main = True  # this process talks to the service (rank 0)
        self.sharded = False  # FSDP2 under begin(): every rank probes in lockstep and applies rank 0's decisions
        self.client: ActuatorClient | None = None
        self.sender: BackgroundSender | None = None
        self.setters: dict[str, KnobSetter] = {}
        self.specs: dict[str, KnobSpec] = {}
        self.policy_doc: PolicyDocument | None = self.policy if isinstance(self.policy, PolicyDocument) else None
        self.run_id: str | None = None
        self.run_token: str | None = None
        self.run_state = "running"
        self.seq = 0
        self.last_decision = 0
        self.epoch: str | None = None  # the service's decision numbering (IngestResult.epoch)
        self.generation = 0  # changes of that numbering seen in this process (the sender's count)
        self.last_ok_step: int | None = None
        self.history: list[dict[str, Any]] = []
        # Decisions applied: the latest APPLIED_KEPT whole, the older folded per knob into
        # applied_summary ({"decisions", "first_step", "last_step", "min", "max"}); applied_total counts all.
        self.applied: list[dict[str, Any]] = []
        self.applied_total = 0
        self.applied_summary: dict[str, dict[str, float]] = {}
        self._superseded_told = False
        self.metrics: dict[str, float] = {}  # the latest training metrics, sent with the next observation
        self.log_extra: dict[str, float] = {}  # for the trainer's next log line (the callback drains it)
        self.max_steps = 0  # the run's length when known (a preset's probe intervals are fitted to it)
        self.unbuilt: set[str] = set()  # probes the policy names that could not be built (said already)
        self.unreachable: ServiceUnavailable | None = None  # at the registration at start
        self.schedule_pending = self.policy_doc is not None
        self.baseline_step: int | None = None  # the step of the baseline reading (start())
        self.last_step: int | None = None  # the latest step given to step() (own loop), or the baseline's
        self.step_warned = False
        self.parts = TrainerParts()  # what the trainer supplies (begin(parts=...))
        self.phases: deque[tuple[str, int | None]] = deque(maxlen=PHASES_KEPT)  # the lifecycle so far (_phase)
        self.checkpoints: list[tuple[int, str]] = []  # (step, directory) saved during this run (checkpoint_saved)
        self.rollbacks: list[dict[str, Any]] = []  # the rewinds done: at_step, to_step, checkpoint

    @staticmethod
    def _make_suite(probes: Any, budget_share: float) -> Any:
        if probes is None:
            return None
        from .probes import ProbeSuite

        if isinstance(probes, ProbeSuite):
            return probes
        return ProbeSuite(list(probes), budget_share=budget_share)

    @property
    def url(self) -> str:
        return str(self.connection.url)

    # -- the start, in the order a run goes through it ----------------------------------------
    def begin(self, model: Any = None, *, step: int = 0, max_steps: int = 0, warmup: int = 0,
              main: bool | None = None, sharded: bool | None = None, parts: TrainerParts | None = None) -> None:
        """The run's start, the one sequence every trainer takes (``ActuatorCallback.on_train_begin``
        is this call with the Trainer's ``parts``):

        1. **open**: connect (rank 0) and fetch a stored policy; rank 0's last word on it
           (``parts.policy_resolved``); its knobs declared;
        2. **agree**: every rank takes rank 0's knobs (sharded, its policy document too); rank 0's
           error stops every rank;
        3. **bind**: ``parts.anchor``, then each knob's setter (given, else ``parts.setters``)
           and its spec; the probes the policy names and the run was not given are built
           (``parts.probe_sources``); sharded, the probes run in lockstep;
        4. **identify**: a preset's ramps sized to the run, the identification test planned;
        5. **resume**: where the checkpoint left the run (``parts.resume``), if any;
        6. **register** (rank 0; a refusal raises ConfigError on every rank, an unreachable
           service lets training start uncontrolled, with a warning);
        7. **share**: rank 0's identification plan on every rank;
        8. **start**: rank 0's checks, the probe schedule, the probes' setup, the sender and the
           baseline reading at ``step``.

        **Collectives: one rule.** Whenever torch.distributed is initialised with more than one
        process, every step above that involves rank 0's word (agree, refusals, share, each step
        boundary's decisions, checkpoints and rewinds) is a collective: call ``begin``, ``step``
        and ``finish`` on every rank alike, under DDP, FSDP2 and DeepSpeed.

        ``max_steps``: the run's length, where known; ``warmup``: its warm-up steps. A ``gains:
        auto`` controller's step test fits the warm-up (given, else the learning-rate setter's
        schedule's), else the first 10% of ``max_steps`` (not given: of the schedule's length),
        else 20 steps.

        ``main``: whether this process talks to the service (default: rank 0 of the process
        group). ``sharded``: whether the probes' forward passes are collectives (FSDP2, DeepSpeed
        ZeRO); default: ``model`` is ``fully_shard``-ed in a process group of more than one. Then
        every rank sets the same probes up (the drift reference sharded like the model) and runs
        them in lockstep (``ProbeSuite.lockstep``: rank 0's schedule, broadcast), and the value
        acknowledged is the one every rank holds (``actuator.agents.sharded``)."""
        self.parts = parts or TrainerParts()
        main = self._take_ranks(model, main=main, sharded=sharded)
        self._phase("open", step)
        self.open_agreed(main=main, prepare=self.parts.policy_resolved)
        self._phase("bind", step)
        self._bind_parts()
        self._phase("identify", step)
        self.start_identification(step, max_steps=max_steps, warmup=warmup)
        if self.parts.resume is not None:
            self.resume(*self.parts.resume, step=step)
        if self.run_name is None:
            self.run_name = self.parts.name
        self._phase("register", step)
        self._stop_if_refused(self.register_at_start() if main else None)
        self._phase("share", step)
        self.share_identification()  # rank 0's step test (or none) on every rank: the replicas step alike
        self._phase("start", step)
        if main:
            self._checks_before_start()
        self.start(model, step=step, max_steps=max_steps)

    def _take_ranks(self, model: Any, *, main: bool | None, sharded: bool | None) -> bool:
        """Whether this process talks to the service (given, else rank 0), and whether it probes
        in lockstep with the others (given, else a ``fully_shard``-ed model among more than one)."""
        rank, world = rank_and_world()
        if sharded is None:
            sharded = world > 1 and model is not None and is_fully_sharded(model)
        self.sharded = bool(sharded)
        return rank == 0 if main is None else main

    def _bind_parts(self) -> None:
        """The trainer's anchor, each knob's setter (given, else found by the trainer) and spec
        (an acknowledged value is every rank's), the probes the policy names built, and sharded,
        the probes in lockstep."""
        parts = self.parts
        if parts.anchor is not None:
            parts.anchor()
        wanted = [name for name in self.knob_bounds if name not in self.extra_setters]
        self.bind_knobs(parts.setters(wanted) if parts.setters is not None and wanted else {})
        check_on_every_rank(self.setters)
        self._stop_if_refused(self.complete_probes(parts.probe_sources))
        if self.sharded and self.suite is not None:
            self.suite.lockstep = from_rank0

    def _phase(self, name: str, step: int | None) -> None:
        """Note a lifecycle phase (``phases``: the latest PHASES_KEPT, for logs and tests)."""
        self.phases.append((name, step))

    def open_agreed(self, *, main: bool, prepare: Callable[[], None] | None = None) -> None:
        """:meth:`open`, then on rank 0 ``prepare()`` (the caller's last word on the policy) and
        :meth:`declare_policy_knobs`; then :meth:`agree_with_rank0` with what failed there."""
        failure: ConfigError | None = None
        try:
            self.open(main=main)
            if main:
                if prepare is not None:
                    prepare()
                self.declare_policy_knobs()
        except ConfigError as exc:
            failure = exc
        self.agree_with_rank0(failure)

    def agree_with_rank0(self, failure: ConfigError | None) -> None:
        """Every rank takes rank 0's knobs (and, sharded, its policy document, whose probe schedule
        it then applies), and rank 0's ``failure`` stops every rank. A collective whenever more than
        one process trains (the one rule, :meth:`begin`)."""
        if rank_and_world()[1] == 1:
            if failure is not None:
                raise failure
            return
        self._phase("agree", None)
        shared = from_rank0({"knobs": self.knob_bounds, "doc": self.policy_doc if self.sharded else None,
                             "error": str(failure) if failure is not None else None})
        if shared["error"] is not None:
            self.close_client()
            raise failure or ConfigError(shared["error"])
        self.knob_bounds = dict(shared["knobs"])
        if self.sharded and not self.main:
            self.policy_doc = shared["doc"]
            self.schedule_pending = self.policy_doc is not None

    def share_identification(self) -> None:
        """A collective (every rank calls it, after the registration at the start): rank 0's
        identification plan (knob, step test, origin step, gains-auto window; or none) is every
        rank's, bound to each rank's own knob spec and nominal value, so the test moves the knob at
        the same steps on every rank and sets the same decisions aside. Only rank 0 may know the
        policy (a stored one is fetched by rank 0) and only rank 0 hears whether the service took
        the test: each rank planning alone would step one replica's learning rate and not the
        other's."""
        ident = self.identification
        mine = None if ident is None else {
            **ident.plan(), "window": self.auto_window.model_dump() if self.auto_window is not None else None,
            "accepted": self.auto_accepted}
        plan = from_rank0(mine)
        if self.main:
            return
        if plan is None:
            self.identification, self.auto_window = None, None
            return
        ident = IdentificationMode.from_plan(plan)
        ident.bind(self.specs[ident.knob], float(self.setters[ident.knob].read()), int(plan["origin"]))
        self.identification = ident
        self.auto_window = IdentificationWindow(**plan["window"]) if plan["window"] is not None else None
        self.auto_accepted = bool(plan["accepted"])

    def _stop_if_refused(self, failure: ConfigError | None) -> None:
        """Rank 0's ``failure`` stops every rank, before the first step (a collective)."""
        message = from_rank0(str(failure) if failure is not None else None)
        if message is not None:
            self.close_client()
            raise failure or ConfigError(message)

    def complete_probes(self, sources: ProbeSources | None) -> ConfigError | None:
        """Build the probes the policy names that this run was not given (``default_probes``, from
        ``sources``), on the ranks that probe. One a controller needs that cannot be built is
        returned as a ConfigError on rank 0 (the run would train without that controller); one only
        guardrails need is a warning (they can never fire)."""
        doc = self.policy_doc
        if sources is None or doc is None or not doc.probes or not (self.main or self.sharded):
            return None
        from .default_probes import missing_probes
        from .probes import ProbeSuite

        if self.suite is None:
            self.suite = ProbeSuite([], budget_share=self.reporting.budget_share)
        found = missing_probes(doc, {p.name for p in self.suite.probes}, sources.tokenizer,
                               reference=sources.reference, teacher=sources.teacher)
        if found.blocking:
            error = ConfigError("; ".join(found.blocking) + ". Pass the probe in probes=[...] (actuator.agents.probes)")
            return error if self.main else None
        for message in found.degraded:
            log.warning("actuator: %s", message)
        self.unbuilt = {spec.name for spec in doc.probes} - {p.name for p in self.suite.probes} - {
            p.name for p in found.built}
        for probe in found.built:
            self.suite.add(probe)
        if found.built:
            log.info("actuator: probes the policy names, built from shipped data: %s",
                     ", ".join(f"{p.name} ({p.num_examples} examples)" for p in found.built))
        return None

    def _checks_before_start(self) -> None:
        """Rank 0, before step 1: a guardrail's rollback that could only halt this run is said, then
        the trainer's own checks (``parts.before_start``)."""
        rollbacks = [g.name for g in (self.policy_doc.guardrails if self.policy_doc else []) if g.action == "rollback"]
        reason = self.parts.rollback_blocked(self.own_saves()) if rollbacks else None
        if reason:
            log.warning("actuator: guardrail(s) %s may order a rollback, which would halt the run instead: %s",
                        ", ".join(rollbacks), reason)
        if self.parts.before_start is not None:
            self.parts.before_start()

    def open(self, *, main: bool = True) -> None:
        """Connect (rank 0 only: ``main``) and fetch a stored policy's document (one that does not
        exist is a ConfigError; an unreachable service is left to the registration)."""
        self.main = main
        if not main:
            return
        self.client = ActuatorClient(self.url, token=self.connection.token, timeout=self.connection.timeout,
                                     max_answer_bytes=self.connection.max_answer_bytes)
        self._resolve_policy()

    def declare_policy_knobs(self) -> None:
        """A policy brings its knobs (with default bounds unless ``knobs`` gave them)."""
        for name in sorted(self.policy_knobs()):
            self.knob_bounds.setdefault(name, {})

    def policy_knobs(self) -> set[str]:
        """The knobs the policy drives (controllers) or scales (guardrails' adjust / rollback)."""
        doc = self.policy_doc
        if doc is None:
            return set()
        return {k for c in doc.controllers for k in c.driven()} | {g.knob for g in doc.guardrails if g.knob}

    def _resolve_policy(self) -> None:
        """A stored policy's document, so that its knobs are declared before registration. Not
        found: ConfigError. Service unreachable: left to the registration (retried later)."""
        if not isinstance(self.policy, str) or self.policy_doc is not None or self.client is None:
            return
        name, _, version = self.policy.partition("@")
        try:
            stored = self.client.get_policy(name, int(version) if version.isdigit() else None)
        except NotFound as exc:
            raise ConfigError(f"policy: the controller at {self.url} has no stored policy {self.policy!r} "
                              "(create it with POST /v1/policies, or pass a document or preset:NAME)") from exc
        except (ServiceUnavailable, RequestRejected):
            return
        self.policy_doc = PolicyDocument.model_validate(stored["document"])
        self.schedule_pending = True

    def bind_knobs(self, setters: Mapping[str, KnobSetter]) -> None:
        """The setters in effect and each knob's spec: the catalogue's defaults around the value
        the setter reads (``nominal()`` when it has one), a setter's own ``bounds``, then the
        bounds given; the value itself always lies within. A knob without a setter is a ConfigError."""
        missing = sorted(set(self.knob_bounds) - set(setters) - set(self.extra_setters))
        if missing:
            raise ConfigError(f"knobs.{missing[0]}: no setter for this knob; pass setters=[...] with an object that "
                              "has name, read() and apply(value) (the KnobSetter protocol, actuator.agents.knobs)")
        self.setters = {name: self.extra_setters.get(name) or setters[name] for name in self.knob_bounds}
        for name, setter in self.extra_setters.items():
            self.setters.setdefault(name, setter)
        for name, setter in self.setters.items():
            value = float(setter.nominal() if hasattr(setter, "nominal") else setter.read())
            spec = default_knob_spec(name, value)
            bounds = getattr(setter, "bounds", None)  # a setter that knows its range (rank: 1..max rank)
            if bounds is not None:
                spec["min"], spec["max"] = float(bounds[0]), float(bounds[1])
            spec.update(self.knob_bounds.get(name, {}))
            spec["min"], spec["max"] = min(spec["min"], value), max(spec["max"], value)
            try:
                self.specs[name] = KnobSpec(name=name, value=value, **spec)
            except ValueError as exc:
                raise ConfigError(f"knobs.{name}: {exc}") from exc

    def start_identification(self, step: int, *, max_steps: int = 0, warmup: int = 0) -> None:
        """Training starts at ``step``: the identification test (if any) counts from there. A
        policy with a ``gains: auto`` controller gets its warm-up step test here (unless
        ``identify=`` already tests that knob), sized to ``warmup`` steps or 10% of ``max_steps``;
        either one not given is read from the learning-rate setter's schedule where it says it."""
        self.fit_ramps(max_steps)
        self.plan_auto_test(step, max_steps=max_steps, warmup=warmup)
        if self.identification is not None:
            knob = self.identification.knob
            self.identification.bind(self.specs[knob], float(self.setters[knob].read()), step)
            if self.auto_window is not None:
                self.auto_window = self.auto_window.model_copy(
                    update={"start": self.identification.start, "end": self.identification.end})

    def fit_ramps(self, max_steps: int) -> None:
        """Before the registration: a preset's setpoint ramps sized to the run
        (``default_probes.fitted_ramps``), on the probe intervals the run will use."""
        doc = self.policy_doc
        if not self.from_preset or doc is None or max_steps <= 0 or self.suite is None:
            return
        from .default_probes import fitted_intervals, fitted_ramps

        fitted = fitted_intervals(doc, max_steps)
        every = {p.name: (p.every if getattr(p, "every_given", True) else fitted.get(p.name))
                 for p in self.suite.probes}
        sized = fitted_ramps(doc, every, max_steps)
        if sized is doc:
            return
        for old, new in zip(doc.controllers, sized.controllers):
            if getattr(old, "setpoint_ramp", 0) != getattr(new, "setpoint_ramp", 0):
                log.info("actuator: controller %r: setpoint ramp sized to the run: %g -> %g probe intervals "
                         "(max_steps=%d, %s every %s steps)", old.name, old.setpoint_ramp, new.setpoint_ramp,
                         max_steps, old.probe, every.get(old.probe or ""))
        self.policy = self.policy_doc = sized

    def plan_auto_test(self, step: int, *, max_steps: int = 0, warmup: int = 0) -> None:
        """The warm-up step test of the policy's gains-auto controller, to declare at registration."""
        spec = auto_controller(self.policy_doc)
        if spec is None or spec.knob not in self.specs:
            return
        if self.identification is not None and self.identification.knob != spec.knob:
            log.warning("actuator: gains auto: identify= steps %s, so controller %r on %s cannot be identified in "
                        "this run: it runs on its fallback gains", self.identification.knob, spec.name, spec.knob)
            return
        if self.identification is None:
            # what the caller does not know, the learning-rate setter's schedule may say
            planned_steps, planned_warmup = schedule_steps(getattr(self.setters.get("learning_rate"), "scheduler", None))
            max_steps, warmup = max_steps or planned_steps, warmup or planned_warmup
            test = warmup_test(spec, self.specs[spec.knob], max_steps=max_steps, warmup=max(0, warmup - step))
            self.identification = IdentificationMode(spec.knob, test)
        test = self.identification.test
        self.auto_window = IdentificationWindow(controller=spec.name, knob=spec.knob, start=step + test.start,
                                                end=step + test.end, size=test.size)
        log.warning("actuator: gains auto: %r: step test on %s over steps %d-%d (hold %d, then %+g in its scale for "
                    "%d steps); decisions on it wait until then (or until the probe passes its setpoint, which ends the test), "
                    "and the service tunes the gains from it",
                    spec.name, spec.knob, self.auto_window.start, self.auto_window.end, test.hold, test.size,
                    test.length)

    def register(self) -> tuple[str, str]:
        """Register the run (at the start; again from the sender's thread while unreachable)."""
        assert self.client is not None
        policy = self.policy if isinstance(self.policy, str) else self.policy.model_dump(mode="json")
        body = RunCreate(name=self.run_name or "run", policy=policy, knobs=list(self.specs.values()),
                         metadata={k: v for k, v in self.metadata.items()
                                   if isinstance(v, (str, int, float, bool)) or v is None},
                         identification=[self.auto_window] if self.auto_window is not None else [],
                         catalogue=CatalogueSpec.travelling())  # knobs / probes registered here only
        if self.run_id is not None and self.run_token is not None:
            return self.run_id, self.run_token  # resumed from a checkpoint: the same run continues
        created = self.client.register_run(body, timeout=max(self.connection.timeout,
                                                             self.connection.register_timeout))
        self.run_id, self.run_token = created.id, created.token
        try:
            # Read as tolerantly as the answer itself: a newer service may add fields.
            self.policy_doc = PolicyDocument.model_validate(created.policy, extra="ignore")
        except ValueError as exc:  # the run is registered: only the probe schedule is lost
            log.warning("actuator: the service's copy of the policy could not be read (%s); probes keep the "
                        "schedule given to ActuatorCallback", exc)
        self.schedule_pending = True
        self._check_auto_accepted(created)
        # At WARNING: stock training scripts (TRL's) show only warnings, and this is how a user finds the run.
        log.warning("actuator: run %s registered (policy %s v%d); console: %s/ui/runs/%s", created.id,
                    created.policy_name, created.policy_version, self.url, created.id)
        return created.id, created.token

    def _check_auto_accepted(self, created: Any) -> None:
        """A service that did not take the warm-up step test (one that predates gains auto drops
        the field) will not tune: say so loudly. Only the registration at the start cancels a test
        not yet started (no test nobody fits); a later one (from the sender's thread, after an
        unreachable start) leaves the plan every rank runs as it is, and says so: cancelling it on
        rank 0 alone would step one replica's knob and not the others'."""
        if self.auto_window is None:
            return
        window = self.auto_window
        accepted = getattr(created, "identification", None) or []
        self.auto_accepted = any(getattr(w, "controller", None) == window.controller for w in accepted)
        if self.auto_accepted:
            return
        planned = self.identification is not None and not self.identification.started
        if not planned:
            outcome = ""
        elif self.plan_fixed:
            outcome = ", and the step test planned at the start still runs (every rank runs the same plan), unfitted"
        else:
            outcome = ", and the step test is not run"
        log.warning("actuator: gains auto is OFF: the service at %s did not accept the warm-up step test of %r (it "
                    "predates gains auto?); the controller runs on its fallback gains, untuned%s", self.url,
                    window.controller, outcome)
        if planned and not self.plan_fixed:
            self.identification = None

    def register_at_start(self) -> ConfigError | None:
        """Register now (one request, at most ``register_timeout`` seconds). A refusal (a 4xx with
        the service's error envelope) is the user's configuration and is returned, to stop
        training before its first step; anything else (no answer, an answer that cannot be read,
        a proxy's page) only means training starts without control, said loudly, and the sender
        registers the run when the service answers."""
        self.unreachable = None
        try:
            self.register()
        except ServiceUnavailable as exc:
            if exc.status_code == 404:  # something that is not the service answers there: likely the URL
                exc = ServiceUnavailable(f"{exc}; check url / ACTUATOR_URL ({self.url}): it must be the controller's "
                                         "base URL", status_code=404)
            self.unreachable = exc
        except RequestRejected as exc:
            # The service answers 404 on POST /v1/runs only for a path it does not serve: the URL, not the policy.
            fix = (f"Check url / ACTUATOR_URL ({self.url}): it must be the controller's base URL, the one its "
                   "/healthz answers on (e.g. http://127.0.0.1:8000)" if isinstance(exc, NotFound)
                   else "Fix the policy or knobs given to ActuatorCallback")
            error = ConfigError(
                f"the controller refused to register this run: {exc}. {fix}; training was not started (only an "
                "unreachable controller lets training run without control)")
            error.__cause__ = exc
            return error
        finally:
            self.plan_fixed = True  # later registrations (the sender's) leave the step test as planned
        return None

    def start(self, model: Any = None, *, step: int = 0, max_steps: int = 0) -> None:
        """On rank 0: the probe schedule, the too-short-run check, the probes' setup (the drift
        reference is taken here), the sender, and the baseline reading at ``step``. Sharded
        (:meth:`begin`), every other rank sets the same probes up and runs the baseline's forward
        passes with rank 0."""
        if not (self.main or self.sharded):
            return
        self.baseline_step = self.last_step = int(step)
        self.max_steps = max_steps
        self.apply_probe_schedule()
        if self.main:
            self._warn_if_too_short(step)
        probing = self.suite is not None and model is not None
        started = time.perf_counter()
        if probing:
            self.suite.setup(model)  # under DDP only rank 0 probes: other ranks take no reference copy
        set_up = time.perf_counter() - started
        if not self.main:
            if probing:
                self.suite.run(model, step, baseline=True)
            return
        assert self.client is not None
        self.sender = BackgroundSender(self.client, run_id=self.run_id, token=self.run_token, register=self.register)
        self.sender.epoch = self.epoch  # a run continued from a checkpoint keeps its numbering
        if self.unreachable is not None:
            self.sender.report_outage(self.unreachable)
        if probing:
            read = time.perf_counter()
            self.observe(step, model, baseline=True)  # the baseline at the start
            self._log_start_up(step, set_up, time.perf_counter() - read)

    def _log_start_up(self, step: int, set_up: float, baseline: float) -> None:
        """What the run paid before its first step, said at train() start: on a short run the
        probes' set-up (the drift reference copy) and the baseline readings can cost more than
        the steps themselves (issue 57: a HotpotQA baseline of 11-29 s on a 10-step run)."""
        metrics = self.history[-1]["metrics"] if self.history and self.history[-1]["step"] == step else {}
        each = ", ".join(f"{k.removeprefix('probe_seconds.')} {v:.2f} s" for k, v in sorted(metrics.items())
                         if k.startswith("probe_seconds."))
        log.info("actuator: start-up before the first step: %.2f s (probe set-up, the drift reference included, "
                 "%.2f s; baseline readings %.2f s%s)", set_up + baseline, set_up, baseline,
                 f": {each}" if each else "")

    def apply_probe_schedule(self) -> None:
        """The policy names probes and how often they run. A policy's word wins over the
        constructor's, so changing a stored policy needs no change to the training script. A
        preset's intervals are defaults instead, fitted to ``max_steps``
        (``default_probes.fitted_intervals``), for the probes whose ``every=`` was not given."""
        self.schedule_pending = False
        doc = self.policy_doc
        if doc is None:
            return
        intervals: dict[str, int | None] = {}
        if self.suite is not None:
            from .default_probes import compared_probes, controller_probes, fitted_intervals

            self.suite.priority |= controller_probes(doc)  # a controller's readings come first
            self.suite.whole |= compared_probes(doc)  # compared with a whole reading: whole or skipped
            if self.from_preset and doc.probes:
                intervals = fitted_intervals(doc, self.max_steps)
        available = {p.name: p for p in (self.suite.probes if self.suite is not None else [])}
        for spec in doc.probes:
            probe = available.get(spec.name)
            if probe is None:
                if spec.name not in self.unbuilt:  # those were named at the start
                    log.warning("actuator: the policy asks for probe %r, which this run was not given "
                                "(pass it in probes=[...]); it will not be measured", spec.name)
                continue
            if not self.from_preset:
                probe.every = spec.every
            elif not getattr(probe, "every_given", True):
                probe.every = intervals[spec.name]
            probe.on_evaluate = spec.on_evaluate

    def _warn_if_too_short(self, step: int) -> None:
        """Say before step 1 when a controller's first decision can only land after the last step."""
        if self.policy_doc is None:
            return
        every = {p.name: p.every for p in (self.suite.probes if self.suite is not None else [])}
        free = {self.identification.knob: self.identification.end} if self.identification is not None else {}
        for message in late_first_decisions(self.policy_doc, every, max_steps=self.max_steps,
                                            start_step=int(step), free_from=free):
            log.warning("actuator: %s", message)
        for message in ramp_beyond_run(self.policy_doc, every, max_steps=self.max_steps, start_step=int(step)):
            log.warning("actuator: %s", message)

    # -- each step boundary --------------------------------------------------------------------
    def step(self, step: int, model: Any = None, *, readings: Mapping[str, float] | None = None,
             metrics: Mapping[str, Any] | None = None) -> StepOutcome:
        """One step boundary (``ActuatorCallback.on_step_end`` is this call): the identification
        test's move, rank 0's answers since the last boundary taken on every rank (a collective
        when more than one process trains), a rollback rewound (:meth:`rewind`; a halt when it
        cannot be), the decisions guarded, applied and acknowledged, a halt marked, the setters'
        periodic work, then due probes run on ``model`` (or the metrics every ``report_every``
        steps) sent. ``readings``: probe values the loop measured itself, sent at this step;
        ``metrics``: training metrics for the next observation."""
        if metrics:
            self.keep_metrics(metrics)
        self._phase("step", step)
        self.identification_step(step)
        received = from_rank0(self.receive())  # every rank applies rank 0's decisions at the same step
        self._check_step(step)
        halt = received.halt
        if received.rollback and not halt:
            halt = not self.rewind(step, received.why)
        before = self.applied_total
        self.apply(received.decisions, step)
        halt = self.halt_if(halt, step, received.why, saving=self.parts.saves_checkpoints)
        self.after_step(step, model, readings)
        return StepOutcome(self.applied[len(self.applied) - (self.applied_total - before):], halt)

    def _check_step(self, step: int) -> None:
        """A loop of one's own numbers its steps: a step that repeats or goes behind the last one
        (the baseline's, read by :meth:`begin` at its ``step``) would put two readings at one step
        and a decision before the step it acts on. Said loudly, once; the step is still taken."""
        last = self.last_step
        if last is not None and step <= last and not self.step_warned:
            self.step_warned = True
            first = "the baseline's, read by begin() at step %d" % last if last == self.baseline_step else \
                "the last step given, %d" % last
            log.warning("actuator: step(%d) does not come after %s: its readings and decisions land on a step already "
                        "reported. Number the training steps from the baseline's step + 1 (for step in range(1, "
                        "steps + 1) after begin() at step 0), as ActuatorCallback does", step, first)
        self.last_step = step if last is None else max(last, step)

    def identification_step(self, step: int) -> None:
        """Before the decisions: at the test's last step the restored value comes first and a
        decision released at that boundary applies on top of it, instead of being undone."""
        if self.identification is not None:
            value = self.identification.due(step)
            if value is not None:
                self.setters[self.identification.knob].apply(value)

    def receive(self) -> Received:
        """The answers the sender brought since the last call (rank 0; empty elsewhere): decisions
        not applied before, a halt or rollback, alerts logged, the last step every guardrail held."""
        out = Received()
        if not self.main or self.sender is None:
            return out
        for answer in self.sender.answers():
            if isinstance(answer, Resync):
                self._resync(answer, out)
            else:
                self._take(answer, out)
        self.sender.note_applied(self.last_decision, self.generation)
        return out

    def _resync(self, change: Resync, out: Received) -> None:
        """The controller's decision history changed under the run (a store restored from a
        backup): take its numbering from where it resumes, loudly. Decisions of the old history
        not applied yet are set aside: the service no longer has them, newer ones follow."""
        stale = len(out.decisions)
        out.decisions.clear()
        log.warning("actuator: control resumed after the controller's history changed: this run had seen decision "
                    "%d, the controller's decisions now follow %d (epoch %s; %s). Decisions after %d are applied; %d "
                    "received from the old history and not applied yet are dropped, the controller no longer has them",
                    change.seen, change.after, change.epoch or "-", change.why, change.after, stale)
        self.last_decision, self.epoch, self.generation = change.after, change.epoch, change.generation

    def _take(self, result: IngestResult, out: Received) -> None:
        for d in result.decisions:
            if d.number > self.last_decision:
                out.decisions.append(d)
                self.last_decision = d.number
        out.halt = out.halt or result.state == "halted"
        out.rollback = out.rollback or any(a.type == "rollback" for a in result.actions)
        out.why += [a.reason for a in result.actions if a.type in ("halt", "rollback") and a.reason not in out.why]
        if not result.breached and result.last_step is not None:
            self.last_ok_step = max(self.last_ok_step or 0, result.last_step)
        for a in result.actions:
            if a.type == "alert":
                log.warning("actuator: guardrail alert: %s", a.reason)
        self.epoch = getattr(result, "epoch", None) or self.epoch
        for notice in getattr(result, "notices", None) or []:  # a service that predates them sends none
            if notice.kind != "history_changed":  # said by _resync, with this run's numbers
                log.warning("actuator: %s", notice.message)

    def halt_if(self, halt: bool, step: int, why: Iterable[str] = (), *, saving: bool = False) -> bool:
        """Mark the run halted (once, with a warning naming ``why``: the guardrail, its reading and
        threshold, as the service said them); whether training should stop. ``saving``: a
        checkpoint is written before stopping (the callback, when the run saves checkpoints)."""
        if halt and self.run_state != "halted":
            self.run_state = "halted"
            reasons = "; ".join(why) or "halted on the service (by an operator, or see the run's events)"
            log.warning("actuator: the controller halted this run at step %d: %s; %s", step, reasons,
                        "saving a checkpoint and stopping" if saving else "stopping (no checkpoint saved)")
        return halt

    def apply(self, decisions: Iterable[DecisionPublic], step: int) -> None:
        """Apply decisions in order at the boundary after ``step``: each is guarded (the run's
        bounds and rate limit), written through its setter and acknowledged with the value read
        back; one that cannot be applied (no setter, identification holds its knob) is
        acknowledged as set aside, with the reason.

        Only the newest decision per knob is applied at one boundary, so the rate limit holds per
        step boundary however many decisions arrive at once; the others are acknowledged as set
        aside, superseded by it."""
        decisions = list(decisions)
        if decisions:
            self._phase("apply", step)
        newest = {d.knob: d for d in decisions}
        superseded = 0
        for d in decisions:
            if newest[d.knob] is d:
                self._apply_one(d, step)
                continue
            superseded += 1
            self._end_test_early(d, step)
            self._acknowledge(d.number, step, None, f"superseded by decision {newest[d.knob].number} on {d.knob} at "
                                                    "the same step boundary (one decision per knob per boundary)")
        if superseded:  # common behind a slow network: said loudly once, then at INFO
            level, self._superseded_told = (logging.INFO if self._superseded_told else logging.WARNING), True
            log.log(level, "actuator: step %d: %d decisions arrived at once; only the newest per knob is applied "
                    "(%s), %d set aside as superseded%s", step, len(decisions),
                    ", ".join(f"{k}: decision {d.number}" for k, d in newest.items()), superseded,
                    "" if level == logging.INFO else " (said at WARNING once; later ones at INFO)")

    def _end_test_early(self, d: DecisionPublic, step: int) -> None:
        """The service ends a gains-auto step test early when the probe passes its setpoint
        (budget): the controller's first decision is that signal, on every rank alike."""
        if (self.identification is not None and self.identification.holds(d.knob, step)
                and self.auto_window is not None and d.controller == self.auto_window.controller):
            log.warning("actuator: gains auto: the service ended the step test on %s early (the probe passed its "
                        "setpoint); %r controls it from step %d, not %d", d.knob, d.controller, step,
                        self.identification.end)
            self.identification = None

    def _apply_one(self, d: DecisionPublic, step: int) -> None:
        setter, spec = self.setters.get(d.knob), self.specs.get(d.knob)
        if setter is None or spec is None:
            log.warning("actuator: decision %d names knob %r, which this run has no setter for", d.number, d.knob)
            self._acknowledge(d.number, step, None, f"this run has no setter for knob {d.knob!r}")
            return
        self._end_test_early(d, step)
        if self.identification is not None and self.identification.holds(d.knob, step):
            log.info("actuator: decision %d on %s set aside: identification runs until step %d", d.number,
                     d.knob, self.identification.end)
            self._acknowledge(d.number, step, None, f"identification holds {d.knob} until step "
                                                    f"{self.identification.end}")
            return
        value = limit(spec, float(setter.read()), d.new_value)
        applied = float(setter.apply(value))
        reason = d.reason if len(d.reason) <= REASON_KEPT else d.reason[:REASON_KEPT - 1] + "…"
        entry: dict[str, Any] = {"number": d.number, "epoch": self.epoch, "step": step, "knob": d.knob,
                                 "ordered": d.new_value, "applied": applied, "reason": reason}
        summary = _setter_summary(setter)
        if summary:
            entry["summary"] = summary  # what the decision put in effect (compression: params, ranks)
        self._keep_applied(entry)
        self._acknowledge(d.number, step, applied, None)
        self.log_extra[f"actuator/{d.knob}_ordered"] = d.new_value
        log.info("actuator: step %d: %s -> %.6g (decision %d: %s)", step, d.knob, applied, d.number, reason)

    def _keep_applied(self, entry: dict[str, Any]) -> None:
        """Keep ``entry``; past twice APPLIED_KEPT, fold the oldest into the per-knob summary."""
        self.applied.append(entry)
        self.applied_total += 1
        if len(self.applied) <= 2 * APPLIED_KEPT:
            return
        old = self.applied[:-APPLIED_KEPT]
        del self.applied[:-APPLIED_KEPT]  # in place: whoever holds the list sees it bounded too
        for e in old:
            s = self.applied_summary.setdefault(e["knob"], {"decisions": 0, "first_step": e["step"],
                                                            "min": e["applied"], "max": e["applied"]})
            s["decisions"] += 1
            s["last_step"] = e["step"]
            s["min"], s["max"] = min(s["min"], e["applied"]), max(s["max"], e["applied"])

    def _acknowledge(self, number: int, step: int, value: float | None, skipped: str | None) -> None:
        """Tell the service, with the next request, what became of decision ``number``."""
        if self.sender is None:
            return  # a non-zero rank: rank 0 acknowledges for the run
        try:
            ack = (DecisionAck(number=number, status="applied", step=step, value=value) if skipped is None else
                   DecisionAck(number=number, status="skipped", step=step, reason=skipped[:500]))
        except ValueError as exc:  # e.g. a setter that read back a non-finite value: telemetry only
            log.warning("actuator: decision %d not acknowledged: %s", number, exc)
            return
        self.sender.acknowledge(ack, self.generation)

    def after_step(self, step: int, model: Any = None, readings: Mapping[str, float] | None = None) -> None:
        """After the decisions: the setters' periodic work, a probe schedule the service sent, then
        due probes (and ``readings``), or the metrics alone every ``report_every`` steps."""
        self.setters_step_end(step)
        if self.schedule_pending and (self.main or self.sharded):
            # only the ranks that probe: under DDP another rank has no probes, and the schedule's
            # "will not be measured" would be a false alarm beside rank 0's readings
            self.apply_probe_schedule()
        if not self.main:
            if self.sharded and self.suite is not None and model is not None:
                self.suite.run(model, step)  # rank 0's probes, in lockstep: their forward passes are collectives
            return
        if readings:
            self.submit(step, {k: float(v) for k, v in readings.items() if math.isfinite(v)})
        ran = self.suite is not None and model is not None and self.observe(step, model)
        ran = ran or bool(readings)
        every = self.reporting.report_every
        if not ran and every and step % every == 0:
            self.submit(step, {})

    def setters_step_end(self, step: int) -> None:
        """Setters with periodic work of their own (``ThresholdKnob`` re-measures its layers'
        sensitivities every K steps) do it here, on every rank alike. A failure is logged and the
        setter keeps its last state: training goes on."""
        for name, setter in self.setters.items():
            hook = getattr(setter, "step_end", None)
            if hook is None:
                continue
            try:
                hook(step)
            except Exception as exc:  # noqa: BLE001 - the agent never stops training
                log.warning("actuator: knob %s: periodic update at step %d failed: %s", name, step, exc)

    # -- observations --------------------------------------------------------------------------
    def evaluated(self, step: int, model: Any = None, metrics: Mapping[str, Any] | None = None) -> None:
        """The trainer evaluated at ``step``: its ``metrics`` are kept, and the probes that run at
        evaluations run (rank 0 sends them; sharded, every rank runs them with rank 0)."""
        self.keep_metrics(metrics)
        if self.suite is None or model is None:
            return
        if self.main:
            self.observe(step, model, evaluate=True)
        elif self.sharded:
            self.suite.run(model, step, evaluate=True)

    def logged(self, step: int, logs: Mapping[str, Any] | None) -> dict[str, float]:
        """The trainer logged ``logs`` at ``step``: they are kept for the next observation (and sent
        at once when the policy reads ``train.<metric>`` inputs: :meth:`train_step_logged`).
        Returns what to add to that log line: the knob values in effect, the decisions applied so
        far, the setters' aggregates and what happened since the last line (an ordered value, a
        rewind), so TensorBoard / W&B show them beside the loss."""
        self.keep_metrics(logs)
        if logs is None:
            return {}
        if self.main:
            self.train_step_logged(step, logs)  # train.<metric> inputs: every logged step
        if not self.setters:
            return {}
        extra = {f"actuator/{name}": value for name, value in self.knob_values().items()}
        extra["actuator/decisions"] = float(self.applied_total)
        # The aggregates of a setter's summary (the per-layer ranks stay in the observations).
        extra.update({f"actuator/{k}": v for k, v in self.setter_summaries().items()
                      if not k.startswith("compression.rank.")})
        extra.update(self.log_extra)
        self.log_extra.clear()
        return extra

    def keep_metrics(self, values: Mapping[str, Any] | None) -> None:
        """Keep the latest training metrics (finite numbers, under observation names) for the next
        observation."""
        for k, v in (values or {}).items():
            name = metric_name(k)
            if name and isinstance(v, (int, float)) and math.isfinite(v) and name != "epoch":
                self.metrics[name] = float(v)

    def train_inputs(self) -> list[str]:
        """The ``train.<metric>`` inputs the policy's controllers and guardrails read."""
        doc = self.policy_doc
        if doc is None:
            return []
        names = [getattr(c, "probe", None) for c in doc.controllers] + [getattr(c, "cost", None) for c in doc.controllers]
        names += [g.probe for g in doc.guardrails]
        return sorted({n for n in names if isinstance(n, str) and n.startswith("train.")})

    def train_step_logged(self, step: int, logs: Mapping[str, Any]) -> None:
        """The trainer logged optimizer step ``step`` (``logs`` has its ``loss``). When the policy reads
        ``train.<metric>`` inputs, this step's metrics go to the service at once, as an observation
        of the step without a probe run (so a controller on them can decide at every logged step).
        An input the trainer did not log at its first step is said loudly, once: the run is not
        controlled on it (the service records a ``controller_unusable`` event too)."""
        names = self.train_inputs()
        if not names or not self.main or "loss" not in logs:
            return
        if not getattr(self, "train_checked", False):
            self.train_checked = True
            logged = sorted(f"train.{n}" for n in (metric_name(k) for k in logs) if n)
            for name in names:
                if name not in logged:
                    log.error("actuator: the policy reads %s, but the trainer did not log %r at step %d (it logged: "
                              "%s): the run is NOT controlled on %s. Check the metric's name and that the trainer "
                              "computes it (GRPO logs kl only when beta > 0)", name, name.removeprefix("train."), step,
                              ", ".join(logged), name)
        self.submit(step, {}, logged_step=True)

    def knob_values(self) -> dict[str, float]:
        return {name: float(s.read()) for name, s in self.setters.items()}

    def setter_summaries(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for setter in self.setters.values():
            out.update(_setter_summary(setter))
        return out

    def observe(self, step: int, model: Any, *, evaluate: bool = False, baseline: bool = False) -> bool:
        """Run the probes due at ``step`` and send what they read; whether any ran."""
        report = self.suite.run(model, step, evaluate=evaluate, baseline=baseline)
        if report is None:
            return False
        self._phase("probe", step)
        probes = {k: v for k, v in report.values.items() if not k.startswith("probe_") and math.isfinite(v)}
        costs = {k: v for k, v in report.values.items() if k.startswith("probe_") and math.isfinite(v)}
        self.submit(step, probes, costs)
        return True

    def submit(self, step: int, probes: dict[str, float], extra_metrics: dict[str, float] | None = None,
               *, logged_step: bool = False) -> None:
        """Hand one observation (probes, metrics, knob values in effect) to the sender. The policy's
        ``train.<metric>`` inputs travel only with the trainer's log of their own step
        (``logged_step``): a probe reading at step N holds step N − 1's log, on which a controller
        would act once and then skip step N's own value."""
        metrics = {**self.metrics, **self.setter_summaries(), **(extra_metrics or {})}
        if not logged_step:
            for name in self.train_inputs():
                metrics.pop(name.removeprefix("train."), None)
        knobs = self.knob_values()
        try:
            obs = ObservationCreate(seq=self.seq, step=step, probes=probes, metrics=metrics, knobs=knobs,
                                    time=time.time())
        except ValueError as exc:  # telemetry must never stop training
            log.warning("actuator: observation at step %d not sent: %s", step, exc)
            return
        self.seq += 1
        self.history.append({"step": step, "probes": probes, "metrics": dict(metrics), "knobs": knobs})
        if self.sender is not None:
            self.sender.submit(obs)

    # -- checkpoints, rewinds and resumes ------------------------------------------------------
    def checkpoint_saved(self, step: int, path: str) -> None:
        """The trainer saved a checkpoint of ``step`` in ``path`` (every rank calls it: a collective
        when more than one process trains). It is a place :meth:`rewind` may go back to; the
        trainer's own state beside it is written on every rank (``parts.save``: e.g. the sharded
        weights), and rank 0 keeps the run token in an owner-only file there, so that a resume
        continues the same run (the token is a secret: never in the checkpoint's JSON)."""
        path = from_rank0(path)  # rank 0's directory names the checkpoint on every rank
        self._phase("checkpoint", step)
        self.checkpoints.append((step, path))
        if self.parts.save is not None:
            self.parts.save(path)
        if self.main and self.run_token and os.path.isdir(path):
            fd = os.open(os.path.join(path, TOKEN_FILE), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(self.run_token)

    def own_saves(self) -> bool:
        """Whether the policy asks the agent for checkpoints of its own at healthy readings
        (``rewind.healthy_saves``: agents/checkpoints.py), a place to rewind to beside the trainer's."""
        return getattr(getattr(self.policy_doc, "rewind", None), "healthy_saves", None) is not None

    def rewind(self, step: int, why: Iterable[str] = ()) -> bool:
        """Roll back to the last checkpoint saved at or before the last step at which every
        guardrail held (rank 0 knows that step and picks; every rank loads it: ``parts.load``);
        False when there is none, or nothing to load it with: the run halts instead. ``why``: the
        service's reasons (the guardrail, its reading and threshold), for the log."""
        because = "; ".join(why) or "a guardrail breach"
        self._phase("rewind", step)
        blocked = self.parts.rollback_blocked(self.own_saves())
        healthy = [(s, p) for s, p in self.checkpoints if self.last_ok_step is not None and s <= self.last_ok_step
                   and os.path.isdir(p)]
        target = from_rank0(None if blocked or not healthy else healthy[-1])
        if target is None:
            log.error("actuator: rollback ordered at step %d (%s) but %s; halting instead", step, because,
                      blocked or "no checkpoint was saved while every guardrail held")
            return False
        to_step, path = target
        assert self.parts.load is not None
        self.parts.load(path)
        self.rollbacks.append({"at_step": step, "to_step": to_step, "checkpoint": path})
        self.log_extra["actuator/rollback_to_step"] = float(to_step)
        log.warning("actuator: %s: rolled back to %s (step %d) at step %d; training continues", because,
                    path, to_step, step)
        return True

    def resume(self, attrs: Mapping[str, Any], directory: str, *, step: int) -> None:
        """Training resumes at ``step`` from the checkpoint in ``directory``, whose saved
        :meth:`attributes` are ``attrs``: the same run continues (with the token kept there, see
        :meth:`checkpoint_saved`; without it the run is registered again)."""
        self._phase("resume", step)
        token = None
        token_file = os.path.join(directory, TOKEN_FILE)
        if attrs.get("run_id") and os.path.exists(token_file):
            with open(token_file) as fh:
                token = fh.read().strip()
        knobs = self.restore(attrs, token=token)
        log.info("actuator: resumed at step %d (seq %d, last decision %d, knobs %s)", step, self.seq,
                 self.last_decision, knobs)

    # -- checkpoints and the end ---------------------------------------------------------------
    def attributes(self) -> dict[str, Any]:
        """Where the run is (JSON): its id, sequence number, last decision, knob values and the
        last step at which every guardrail held. The token is not in it (a secret)."""
        return {"run_id": self.run_id, "seq": self.seq, "last_decision": self.last_decision,
                "decision_epoch": self.epoch, "saved_knobs": self.knob_values() if self.setters else {}, "last_ok_step": self.last_ok_step}

    def restore(self, attrs: Mapping[str, Any], *, token: str | None = None) -> dict[str, float]:
        """Continue where :meth:`attributes` left off; ``token``: the run token kept beside the
        checkpoint (without it the run is registered again). Knobs other than the learning rate
        (which lives in the optimizer/scheduler state a checkpoint restores) are applied; returns
        the saved knob values."""
        self.seq = int(attrs.get("seq", 0))
        self.last_decision = int(attrs.get("last_decision", 0))
        self.epoch = attrs.get("decision_epoch")  # None from checkpoints before epochs
        if self.sender is not None and self.sender.generation == self.generation:
            self.sender.epoch = self.epoch
        self.last_ok_step = attrs.get("last_ok_step")
        knobs = attrs.get("saved_knobs", attrs.get("knobs")) or {}  # "knobs": checkpoints before 0.1.1
        for name, value in knobs.items():
            setter = self.setters.get(name)
            if setter is not None and name != "learning_rate":
                setter.apply(float(value))
        if attrs.get("run_id") and token is not None:
            self.run_id, self.run_token = attrs["run_id"], token
            if self.auto_window is not None:
                # the same run continues: its warm-up step test was declared (and fitted) before
                log.warning("actuator: gains auto: the run continues from a checkpoint; no new step test (the "
                            "service keeps what it tuned, or the fallback gains)")
                self.auto_window = None
                if self.identification is not None and not self.identification.started:
                    self.identification = None
        return dict(knobs)

    def close_client(self) -> None:
        if self.client is not None:
            self.client.close()

    def finish(self, step: int | None = None) -> bool:
        """Send the run's last step (``step``: where training ended; an observation of the
        training metrics and knobs, when the last one sent is older), deliver what is buffered (at
        most ``flush_timeout`` seconds), mark the run finished unless the controller halted it, and
        close the connection; whether everything was delivered."""
        self._phase("finish", step)
        if self.sender is None:
            return True
        if step is not None and (not self.history or self.history[-1]["step"] < step):
            self.submit(step, {})  # the run's list and charts end where training did
        delivered = self.sender.close(self.connection.flush_timeout)
        if not delivered:
            log.warning("actuator: %d observations could not be delivered before train end", self.sender.backlog)
        if self.run_id and self.client is not None and self.run_state == "running":
            try:
                self.client.finish(self.run_id, token=self.run_token)
            except (ServiceUnavailable, RequestRejected) as exc:
                log.warning("actuator: could not mark the run finished: %s", exc)
        self.close_client()
        return delivered
