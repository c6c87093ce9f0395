"""ActuatorCallback: one callback that puts a Hugging Face ``Trainer`` (or a TRL trainer, which
subclasses it) under closed-loop control.

    trainer = GRPOTrainer(..., callbacks=[ActuatorCallback("preset:rl-kl")])
    trainer.train()

``Trainer(callbacks=[cb])`` and ``cb.attach(trainer)`` are the same: the callback finds its trainer
at ``on_init_end`` and puts itself before the ``report_to`` loggers.

What happens, step by step (docs/explanation/architecture.md, "The loop"):
1. ``on_train_begin``: the policy is resolved (a stored one is fetched) and brings its knobs; each
   knob's setter is found from the trainer (learning rate: optimizer and scheduler; ``kl_beta``:
   TRL DPO/GRPO/RLOO; ``distill_lambda`` / ``gkd_beta`` / ``onpolicy_fraction`` / ``divergence_mix`` /
   ``distill_temperature``: distillation and GKD trainers; ``rank``:
   factorised layers or LoRA; ``kl_weight``: the KL anchor) unless ``setters`` gives one; the run
   is registered (one request). A refusal (the service's 4xx: a bad policy, knob or token) raises
   :class:`~actuator.ConfigError` before the first step; anything else (unreachable, an answer
   that cannot be read) lets training start without control, with a warning, and the background
   sender registers the run when the service answers. The probes the policy names that the run was
   not given are built from shipped data (``default_probes``; one a controller needs and nothing
   shipped can stand in for is a ConfigError), a preset's probe intervals are fitted to
   ``max_steps``, then probes are set up (the drift reference is snapshotted here), the sender is
   started and the baseline is read.
2. ``on_step_end`` (a step boundary): results that came back are applied — knob decisions are
   clamped to the run's bounds and rate limit on this side too, then written through the
   setters, and the value read back is what the next observation reports. Then due probes run,
   and the observation is handed to the sender: training never waits on the network.
3. Distributed runs: rank 0 talks to the service; its configuration, refusals and decisions are
   broadcast so every rank applies the same values at the same step.
4. The service down: training continues with the last values; one warning per outage.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
import weakref
from typing import Any

from actuator._exceptions import ConfigError, NotFound, RequestRejected, ServiceUnavailable
from actuator.client import ActuatorClient
from actuator.policy import PolicyDocument, load_policy, load_preset, protect_policy
from actuator.schemas import DecisionAck, DecisionPublic, KnobSpec, ObservationCreate, RunCreate

from ._hf_compat import find_trainer, load_checkpoint, rollback_unsupported, run_before_loggers, sharding_unsupported
from .identification import IdentificationMode
from .preflight import check_url, late_first_decisions
from .knobs import KnobNotSupported, KnobSetter, LearningRateKnob
from .sender import BackgroundSender

__all__ = ["ActuatorCallback", "default_knob_spec"]

log = logging.getLogger("actuator.agents")

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState
except ImportError as exc:
    from .models import training_stack_missing

    raise training_stack_missing("ActuatorCallback", exc) from exc


def default_knob_spec(name: str, value: float) -> dict[str, Any]:
    """Bounds a user gets when they name a knob without bounds.

    The learning rate the user configured is its ceiling: a controller may slow a run down to
    protect a capability but never, by default, train faster than the user chose (a 10x lr is
    how runs diverge). Betas may rise 10x (a larger beta keeps the policy closer to its
    reference, the conservative direction) and fall 100x.
    """
    if name == "learning_rate" and value > 0:
        return {"min": value / 100.0, "max": value, "scale": "log", "max_step": 0.7}
    if name == "kl_beta" and value > 0:
        return {"min": value / 100.0, "max": value * 10.0, "scale": "log", "max_step": 0.7}
    if name == "gkd_beta":
        # GKD's beta interpolates forward and reverse KL (a share in [0, 1]), not a multiplier.
        return {"min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.2}
    if name == "kl_weight":
        # A Lagrange multiplier: 0 is "anchor off"; at 2 the anchor already outweighs a typical
        # task loss (forgetting benchmark: w = 3 costs a third of the task); 0.25 per decision.
        return {"min": 0.0, "max": 2.0, "scale": "linear", "max_step": 0.25}
    if name in ("distill_lambda", "onpolicy_fraction", "divergence_mix"):
        return {"min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.2}
    if name == "distill_temperature" and value > 0:
        # T acts multiplicatively on the logits: a factor 4 either way, at most x1.5 per decision.
        return {"min": value / 4.0, "max": value * 4.0, "scale": "log", "max_step": 0.4}
    if name == "rank":
        return {"min": 1.0, "max": max(1.0, value), "scale": "integer", "max_step": None}
    if name == "compression_threshold" and value > 0:
        # A threshold on sensitivities, which span decades: log scale, at most x2 per decision.
        # ThresholdKnob's own bounds (the sensitivities' range) replace min and max.
        return {"min": value / 1e6, "max": value * 1e6, "scale": "log", "max_step": math.log(2.0)}
    if name == "mlp_channel_threshold" and value > 0:
        # Channel importances are bunched: on SmolLM2, x1.8 of tau goes from 99% to 85% of the
        # dense parameters, so at most x1.05 per decision (~1.5% of the parameters). The
        # setter's bounds (the importances' range) replace min and max.
        return {"min": value / 1e6, "max": value * 1e6, "scale": "log", "max_step": math.log(1.05)}
    return {"min": value, "max": value, "scale": "linear", "max_step": None}


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


def _metric_name(key: str) -> str | None:
    """Trainer/TRL log keys as observation names: TRL logs 'rewards/margins', which becomes
    'rewards.margins'; a key that still is not a valid name is dropped (None)."""
    name = str(key).replace("/", ".")
    return name if _NAME.match(name) else None


def _unwrap_scheduler(sched: Any) -> Any:
    # accelerate's AcceleratedScheduler wraps the LambdaLR that owns base_lrs.
    while sched is not None and not hasattr(sched, "base_lrs") and hasattr(sched, "scheduler"):
        sched = sched.scheduler
    return sched


# Every ActuatorCallback alive, so that one transformers rebuilt from a checkpoint can find the one
# the script configured (see ActuatorCallback._predecessor).
_LIVE: weakref.WeakSet[ActuatorCallback] = weakref.WeakSet()

# The setter each knob gets from the trainer, as the error messages name it.
_SETTERS = {
    "kl_beta": "actuator.agents.trl_knobs.KLBetaKnob(trainer)",
    "distill_lambda": "actuator.agents.distill.DistillLambdaKnob(trainer)",
    "gkd_beta": "actuator.agents.distill.GKDBetaKnob(trainer)",
    "onpolicy_fraction": "actuator.agents.distill.OnPolicyFractionKnob(trainer)",
    "divergence_mix": "actuator.agents.distill.DivergenceMixKnob(trainer)",
    "distill_temperature": "actuator.agents.distill.DistillTemperatureKnob(trainer)",
    "rank": "actuator.agents.compression.RankKnob(model)",
    "kl_weight": "actuator.agents.anchor.KLAnchorKnob(anchor)",
    "compression_threshold": "actuator.agents.compression.ThresholdKnob(model, calibration)",
    "mlp_channel_threshold": "actuator.agents.compression.ChannelThresholdKnob(model, calibration)",
}


def _rank_setter(model: Any) -> KnobSetter:
    """``rank``: the factorised layers' active rank (compression.factorize), else PEFT LoRA masks."""
    from .compression import LoraRankKnob, RankKnob, lowrank_layers
    from .probes._common import is_peft_model

    if model is not None and lowrank_layers(model):
        return RankKnob(model)
    if model is not None and is_peft_model(model):
        return LoraRankKnob(model)
    raise KnobNotSupported(
        "the model has no LowRankLinear layers and is not a PEFT LoRA model; call "
        "actuator.agents.compression.factorize(model, ...) before building the trainer (or pass "
        "setters=[actuator.agents.compression.LoraRankKnob(peft_model)] / AdaLoraBudgetKnob for adapters)")


def _json_safe(value: Any) -> Any:
    """``value`` with only JSON types (trainer_state.json is written with json.dumps)."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    try:
        return float(value)  # numpy and torch scalars
    except (TypeError, ValueError):
        return str(value)


class ActuatorCallback(TrainerCallback, ExportableState):
    """Stream probes to the controller service and apply its decisions at step boundaries.

    Args:
        policy: a stored policy's name (``"sft-drift"`` or ``"sft-drift@3"``), a shipped preset
            (``"preset:sft-capability"``), or a policy document (dict, YAML/JSON path,
            :class:`PolicyDocument`) registered with the run.
        protect: the one-line form instead of ``policy``:
            ``protect={"hotpotqa.gold_logprob": "-5%", "kl_drift": 0.1}`` builds one guardrail
            per probe; drift probes take ``on_drift`` (default ``adjust``), the others
            ``on_breach`` (default ``rollback``: restore the last checkpoint at which every
            guardrail held and continue with a damped learning rate).
        url: controller service URL (default ``$ACTUATOR_URL`` or ``http://127.0.0.1:8000``).
        token: admin token for registration when the service has one (``$ACTUATOR_TOKEN``).
        probes: a list of probes or a ``ProbeSuite`` (``actuator.agents.probes``).
        knobs: bounds per knob, ``{"learning_rate": {"min": 1e-6, "max": 1e-3, "max_step": 0.5}}``;
            a knob named without bounds gets :func:`default_knob_spec`. Default: learning_rate.
        setters: extra knob setters (``KnobSetter``) for knobs other than the learning rate.
        run_name: a name for the run (default: the trainer's ``run_name`` / output dir).
        budget_share: the largest share of wall time probes may take (default 10%).
        timeout: the longest one request may take, in seconds, its whole answer included (the
            sender's, never training's): an answer slower than that is an outage, retried.
        register_timeout: how long ``train()`` may wait at its start for the registration's answer
            (a refusal stops training there; no answer in time lets it start without control).
        flush_timeout: seconds to wait at train end for buffered observations.
        report_every: also send training metrics every N steps without probes (0: only with probes).
        identify: identification mode for a short pre-run, ``{"knob": "learning_rate", "size": 0.5,
            "hold": 10, "length": 40}`` (or an :class:`~actuator.agents.identification.IdentificationMode`):
            the knob is stepped by ``size`` (log units for a log knob) after ``hold`` steps, held for
            ``length`` steps and restored; the service's decisions on it wait until then. Then
            ``actuator policy tune --run RUN_ID --controller NAME`` fits the run.
    """

    def __init__(
        self,
        policy: str | dict[str, Any] | PolicyDocument | os.PathLike[str] | None = None,
        *,
        protect: dict[str, float | str] | None = None,
        on_drift: str = "adjust",
        on_breach: str = "rollback",
        url: str | None = None,
        token: str | None = None,
        probes: Any = None,
        knobs: dict[str, dict[str, Any]] | None = None,
        setters: list[KnobSetter] | None = None,
        run_name: str | None = None,
        budget_share: float = 0.10,
        timeout: float = 2.0,
        register_timeout: float = 10.0,
        flush_timeout: float = 10.0,
        report_every: int = 0,
        metadata: dict[str, Any] | None = None,
        identify: IdentificationMode | dict[str, Any] | None = None,
    ) -> None:
        if (policy is None) == (protect is None):
            raise ConfigError("policy: give a policy (name, preset:NAME, document) or protect={...}, not both")
        self._protect = (dict(protect), on_drift, on_breach) if protect is not None else None
        # A preset's probe intervals are defaults fitted to the run (a probe's own every= wins); a
        # policy the user wrote or stored sets them (the service's word: a schedule change needs no
        # change to the training script).
        self._from_preset = isinstance(policy, str) and policy.startswith("preset:")
        if protect is not None:
            self.policy: str | PolicyDocument = protect_policy(protect, on_drift=on_drift, on_breach=on_breach)
        elif isinstance(policy, str) and policy.startswith("preset:"):
            self.policy = load_preset(policy.removeprefix("preset:"))
        elif isinstance(policy, str) and "\n" not in policy and not policy.endswith((".yaml", ".yml", ".json")):
            self.policy = policy  # a stored policy on the service
        else:
            self.policy = load_policy(policy)  # PolicyError now, not mid-run
        self.url = check_url(url) if url else check_url(os.environ.get("ACTUATOR_URL", "http://127.0.0.1:8000"),
                                                        field="ACTUATOR_URL")
        self.token = token or os.environ.get("ACTUATOR_TOKEN")
        self.knob_bounds = dict(knobs or {"learning_rate": {}})
        self.extra_setters = {s.name: s for s in (setters or [])}
        self.run_name = run_name
        self.timeout, self.flush_timeout, self.register_timeout = timeout, flush_timeout, register_timeout
        self.report_every = report_every
        self.metadata = dict(metadata or {})
        self.identification = IdentificationMode.from_config(identify) if identify is not None else None
        if self.identification is not None:
            self.knob_bounds.setdefault(self.identification.knob, {})
        self.suite = self._make_suite(probes, budget_share)
        self.trainer: Any = None
        # run-time state
        self.setters: dict[str, KnobSetter] = {}
        self.specs: dict[str, KnobSpec] = {}
        self.sender: BackgroundSender | None = None
        self.client: ActuatorClient | None = None
        self.run_id: str | None = None
        self.run_token: str | None = None
        self.seq = 0
        self.last_decision = 0
        self.applied: list[dict[str, Any]] = []  # decisions applied, for logs and reports
        self.history: list[dict[str, Any]] = []  # what was observed, for the caller's own tables
        self.run_state = "running"
        self.policy_doc: PolicyDocument | None = self.policy if isinstance(self.policy, PolicyDocument) else None
        self._schedule_pending = self.policy_doc is not None
        self.checkpoints: list[tuple[int, str]] = []  # (step, dir) saved during this run
        self.last_ok_step: int | None = None  # latest observed step at which every guardrail held
        self.rollbacks: list[dict[str, Any]] = []
        self._metrics: dict[str, float] = {}
        self._log_extra: dict[str, float] = {}
        self._is_main = True
        self._started = False  # on_train_begin ran
        self._unreachable: ServiceUnavailable | None = None  # at train begin
        self._max_steps = 0  # the trainer's, at train begin (a preset's probe intervals are fitted to it)
        self._unbuilt: set[str] = set()  # probes the policy names that train begin could not build (said then)
        self.budget_share = budget_share
        _LIVE.add(self)

    # Set through transformers' ExportableState restore (``state()["attributes"]``): this instance
    # was rebuilt from a checkpoint and should hand over to the one the user configured.
    _from_checkpoint = False

    @staticmethod
    def _make_suite(probes: Any, budget_share: float) -> Any:
        if probes is None:
            return None
        from .probes import ProbeSuite

        if isinstance(probes, ProbeSuite):
            return probes
        return ProbeSuite(list(probes), budget_share=budget_share)

    # -- binding ---------------------------------------------------------------------------
    def attach(self, trainer: Any) -> ActuatorCallback:
        """Bind to ``trainer`` and add the callback to it: the same as ``Trainer(callbacks=[cb])``,
        which finds its trainer by itself (``on_init_end``)."""
        self._bind(trainer)
        return self

    def _bind(self, trainer: Any, *, anchor: bool = True) -> None:
        self.trainer = trainer
        # Right after DefaultFlowCallback, so our on_log runs before TensorBoard/W&B/MLflow's and
        # the knob values we add to the logs reach them (transformers puts `callbacks=[...]` last).
        run_before_loggers(trainer, self)
        if anchor:
            self._anchor_pairs()

    def _anchor_pairs(self, args: Any = None, state: Any = None, model: Any = None) -> None:
        """``kl_weight`` (``preset:dpo-kl``) on a trainer of preference pairs without a KL anchor:
        put one on it, on its own pairs (prompt + chosen), so that the one-line attach works on a
        stock ``DPOTrainer``. Before ``train()`` this changes the trainer's class only; from inside
        ``on_train_begin`` (``state`` given) the anchor's reference is taken here too. A trainer
        without pairs is left alone: ``train()`` start then names the missing anchor."""
        trainer = self.trainer
        wanted = "kl_weight" in self._policy_knobs() | set(self.knob_bounds)
        if (trainer is None or not wanted or "kl_weight" in self.extra_setters
                or getattr(trainer, "kl_anchor", None) is not None):
            return
        from .anchor import KLAnchor, install_anchor, pair_token_ids
        from .default_probes import tokenizer_of

        tokenizer = tokenizer_of(getattr(trainer, "processing_class", None))
        try:
            ids = pair_token_ids(getattr(trainer, "train_dataset", None), tokenizer) if tokenizer is not None else []
            if not ids:
                return
            callback = install_anchor(trainer, KLAnchor(None, tokenizer, token_ids=ids))
        except Exception as exc:  # noqa: BLE001 - a dataset we cannot read: train() start names the missing anchor
            log.warning("actuator: could not put a KL anchor on the trainer's pairs (%s: %s)", type(exc).__name__, exc)
            return
        log.info("actuator: kl_weight: a KL anchor on %d of the trainer's pairs (prompt + chosen) was added to %s",
                 len(ids), type(trainer).__name__)
        if state is not None:
            if state.global_step:  # resumed: the anchor's cache was saved beside the checkpoint loaded
                trainer._anchor_resume_dir = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            callback.on_train_begin(args, state, None, model=model)

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is None:
            trainer = find_trainer(self)
            if trainer is not None:
                self._bind(trainer)

    def _policy_knobs(self) -> set[str]:
        """The knobs the policy drives (controllers) or scales (guardrails' adjust / rollback)."""
        doc = self.policy_doc
        if doc is None:
            return set()
        return {c.knob for c in doc.controllers} | {g.knob for g in doc.guardrails if g.knob}

    def _add_policy_knobs(self) -> None:
        """A policy brings its knobs: ``preset:rl-kl`` declares ``kl_beta``, ``preset:compress-ppl``
        ``rank``, ... with default bounds unless ``knobs`` gives them; their setters are found from
        the trainer (:meth:`_setter_for`). ``protect={...}`` holds its absolute budgets with the KL
        anchor's weight when the trainer has one."""
        if getattr(self.trainer, "kl_anchor", None) is not None and self._protect is not None and self.run_id is None:
            protect, on_drift, on_breach = self._protect
            self.policy = self.policy_doc = protect_policy(protect, on_drift=on_drift, on_breach=on_breach,
                                                           anchor=True)
        for name in sorted(self._policy_knobs()):
            self.knob_bounds.setdefault(name, {})

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
        self._schedule_pending = True

    def _setter_for(self, name: str, optimizer: Any, lr_scheduler: Any, model: Any) -> KnobSetter:
        """The setter of a knob, found from the trainer (see ``_SETTERS`` for what each knob needs)."""
        trainer = self.trainer
        try:
            if name == "learning_rate":
                if optimizer is None:
                    raise ConfigError("knobs.learning_rate: the trainer has no optimizer yet")
                return LearningRateKnob(optimizer, _unwrap_scheduler(lr_scheduler))
            if trainer is None and name in _SETTERS:
                raise ConfigError(f"knobs.{name}: the callback could not find its trainer; attach it with "
                                  f".attach(trainer), or pass setters=[{_SETTERS[name]}]")
            if name == "kl_weight":
                anchor = getattr(trainer, "kl_anchor", None)
                if anchor is None:
                    raise ConfigError("knobs.kl_weight: the trainer has no KL anchor; build it with "
                                      "actuator.agents.anchor.anchor_trainer(YourTrainer)(..., kl_anchor=KLAnchor(texts, "
                                      "tokenizer)), or pass setters=[KLAnchorKnob(anchor)] for your own loop")
                from .anchor import KLAnchorKnob

                return KLAnchorKnob(anchor)
            if name == "kl_beta":
                from .trl_knobs import KLBetaKnob

                return KLBetaKnob(trainer)
            if name == "distill_lambda":
                from .distill import DistillLambdaKnob

                return DistillLambdaKnob(trainer)
            if name == "gkd_beta":
                from .distill import GKDBetaKnob

                return GKDBetaKnob(trainer)
            if name in ("onpolicy_fraction", "divergence_mix", "distill_temperature"):
                from . import distill

                cls = {"onpolicy_fraction": distill.OnPolicyFractionKnob, "divergence_mix": distill.DivergenceMixKnob,
                       "distill_temperature": distill.DistillTemperatureKnob}[name]
                return cls(trainer)
            if name == "rank":
                return _rank_setter(model if model is not None else getattr(trainer, "model", None))
            if name in ("compression_threshold", "mlp_channel_threshold"):
                raise ConfigError(f"knobs.{name}: the threshold knob measures sensitivities on calibration data the "
                                  f"callback does not have; pass setters=[{_SETTERS[name]}]")
        except KnobNotSupported as exc:
            hint = f" (the setter the callback tried: {_SETTERS[name]})" if name in _SETTERS else ""
            raise ConfigError(f"knobs.{name}: {exc}{hint}") from exc
        raise ConfigError(f"knobs.{name}: no setter for this knob; pass setters=[...] with an object that has "
                          "name, read() and apply(value) (the KnobSetter protocol, actuator.agents.knobs)")

    def _bind_setters(self, optimizer: Any, lr_scheduler: Any, model: Any = None) -> None:
        for name in self.knob_bounds:
            if name in self.extra_setters:
                self.setters[name] = self.extra_setters[name]
            else:
                self.setters[name] = self._setter_for(name, optimizer, lr_scheduler, model)
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

    # -- registration ---------------------------------------------------------------------------
    def _register(self) -> tuple[str, str]:
        """Register the run (at train begin; again from the sender's thread while unreachable)."""
        assert self.client is not None
        policy = self.policy if isinstance(self.policy, str) else self.policy.model_dump(mode="json")
        body = RunCreate(name=self.run_name or "run", policy=policy, knobs=list(self.specs.values()),
                         metadata={k: v for k, v in self.metadata.items()
                                   if isinstance(v, (str, int, float, bool)) or v is None})
        if self.run_id is not None and self.run_token is not None:
            return self.run_id, self.run_token  # resumed from a checkpoint: the same run continues
        created = self.client.register_run(body, timeout=max(self.timeout, self.register_timeout))
        self.run_id, self.run_token = created.id, created.token
        try:
            # Read as tolerantly as the answer itself: a newer service may add fields.
            self.policy_doc = PolicyDocument.model_validate(created.policy, extra="ignore")
        except ValueError as exc:  # the run is registered: only the probe schedule is lost
            log.warning("actuator: the service's copy of the policy could not be read (%s); probes keep the "
                        "schedule given to ActuatorCallback", exc)
        self._schedule_pending = True
        # At WARNING: stock training scripts (TRL's) show only warnings, and this is how a user finds the run.
        log.warning("actuator: run %s registered (policy %s v%d); console: %s/ui/runs/%s", created.id,
                    created.policy_name, created.policy_version, self.url, created.id)
        return created.id, created.token

    def _register_at_start(self) -> ConfigError | None:
        """Register now (one request, at most ``register_timeout`` seconds). A refusal (a 4xx with
        the service's error envelope) is the user's configuration and is returned, to stop
        ``train()`` before its first step; anything else (no answer, an answer that cannot be read,
        a proxy's page) only means training starts without control, said loudly, and the sender
        registers the run when the service answers."""
        self._unreachable = None
        try:
            self._register()
        except ServiceUnavailable as exc:
            if exc.status_code == 404:  # something that is not the service answers there: likely the URL
                exc = ServiceUnavailable(f"{exc}; check url / ACTUATOR_URL ({self.url}): it must be the controller's "
                                         "base URL", status_code=404)
            self._unreachable = exc
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
        return None

    # -- trainer events --------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> Any:
        if self.trainer is None:
            trainer = find_trainer(self)
            predecessor = self._predecessor(trainer) if trainer is not None and self._from_checkpoint else None
            if predecessor is not None:
                return self._hand_back(predecessor, trainer, args, state, control, model=model, optimizer=optimizer,
                                       lr_scheduler=lr_scheduler, **kwargs)
            if trainer is not None:
                self._bind(trainer, anchor=False)  # the anchor, if any, after the policy is resolved
        else:
            run_before_loggers(self.trainer, self)  # a resume may have re-added us last
        self._started = True
        self._max_steps = int(getattr(state, "max_steps", 0) or 0)
        trainer = self.trainer
        if trainer is not None and (sharded := sharding_unsupported(trainer)):
            raise ConfigError(sharded)
        optimizer = optimizer if optimizer is not None else getattr(trainer, "optimizer", None)
        lr_scheduler = lr_scheduler if lr_scheduler is not None else getattr(trainer, "lr_scheduler", None)
        self._is_main = bool(getattr(state, "is_world_process_zero", True))
        failure: ConfigError | None = None
        if self._is_main:
            self.client = ActuatorClient(self.url, token=self.token, timeout=self.timeout)
            try:
                self._resolve_policy()
                self._add_policy_knobs()
            except ConfigError as exc:
                failure = exc
        shared = self._from_rank0({"knobs": self.knob_bounds, "error": str(failure) if failure else None})
        if shared["error"] is not None:
            raise failure or ConfigError(shared["error"])
        self.knob_bounds = dict(shared["knobs"])
        self._anchor_pairs(args, state, model)
        self._bind_setters(optimizer, lr_scheduler, model)
        failure = None
        if self._is_main:
            try:
                self._complete_probes()
            except ConfigError as exc:
                failure = exc
        self._stop_if_refused(failure)
        if self.identification is not None:
            knob = self.identification.knob
            self.identification.bind(self.specs[knob], float(self.setters[knob].read()), state.global_step)
        self._restore(args, state)
        if self.run_name is None:
            self.run_name = (getattr(args, "run_name", None) or os.path.basename(str(args.output_dir)) or "run")[:128]
        self._stop_if_refused(self._register_at_start() if self._is_main else None)
        if any(g.action == "rollback" for g in (self.policy_doc.guardrails if self.policy_doc else [])):
            reason = rollback_unsupported(trainer)
            if reason:
                log.warning("actuator: the policy may order a rollback, which would halt instead: %s", reason)
        if self._is_main:
            self._apply_probe_schedule()
            self._warn_if_too_short(state)
        if self.suite is not None and model is not None and self._is_main:
            self.suite.setup(model)  # only rank 0 probes: other ranks take no reference copy
        if self._is_main:
            self.sender = BackgroundSender(self.client, run_id=self.run_id, token=self.run_token,
                                           register=self._register)
            if self._unreachable is not None:
                self.sender.report_outage(self._unreachable)
            if self.suite is not None and model is not None:
                self._observe(state.global_step, model, baseline=True)  # the baseline at step 0
        return None

    def _stop_if_refused(self, failure: ConfigError | None) -> None:
        """Rank 0's refusal stops ``train()`` on every rank, before the first step."""
        error = self._from_rank0(str(failure) if failure else None)
        if error is not None:
            self._close_client()
            raise failure or ConfigError(error)

    def _complete_probes(self) -> None:
        """Build the probes the policy names that this run was not given (``default_probes``), and
        budget the probes controllers act on first. One a controller needs that cannot be built is
        a ConfigError (the run would train without that controller); one only guardrails need is a
        warning (they can never fire)."""
        doc = self.policy_doc
        if doc is None or not doc.probes:
            return
        from .default_probes import missing_probes, tokenizer_of
        from .probes import ProbeSuite

        if self.suite is None:
            self.suite = ProbeSuite([], budget_share=self.budget_share)
        trainer = self.trainer
        found = missing_probes(doc, {p.name for p in self.suite.probes},
                               tokenizer_of(getattr(trainer, "processing_class", None)),
                               reference=getattr(trainer, "ref_model", None),
                               teacher=getattr(trainer, "teacher_model", None))
        if found.blocking:
            raise ConfigError("; ".join(found.blocking) + ". Pass the probe in probes=[...] (actuator.agents.probes)")
        for message in found.degraded:
            log.warning("actuator: %s", message)
        self._unbuilt = {spec.name for spec in doc.probes} - {p.name for p in self.suite.probes} - {
            p.name for p in found.built}
        for probe in found.built:
            self.suite.add(probe)
        if found.built:
            log.info("actuator: probes the policy names, built from shipped data: %s",
                     ", ".join(f"{p.name} ({p.num_examples} examples)" for p in found.built))

    def _warn_if_too_short(self, state: Any) -> None:
        """Say before step 1 when a controller's first decision can only land after the last step."""
        if self.policy_doc is None:
            return
        every = {p.name: p.every for p in (self.suite.probes if self.suite is not None else [])}
        free = {self.identification.knob: self.identification.end} if self.identification is not None else {}
        for message in late_first_decisions(self.policy_doc, every, max_steps=self._max_steps,
                                            start_step=int(state.global_step), free_from=free):
            log.warning("actuator: %s", message)

    # -- resume with restore_callback_states_from_checkpoint=True ------------------------------
    def _predecessor(self, trainer: Any) -> ActuatorCallback | None:
        """The callback HF replaced by this one (rebuilt from a checkpoint's ``state()``): the live
        one bound to the same trainer and no longer in its callbacks, or the only unbound one."""
        handler = trainer.callback_handler.callbacks
        candidates = [cb for cb in list(_LIVE) if cb is not self and not cb._from_checkpoint and not cb._started
                      and type(cb) is type(self) and not any(cb is h for h in handler)
                      and cb.trainer in (None, trainer)]
        bound = [cb for cb in candidates if cb.trainer is trainer]
        if len(bound) == 1:
            return bound[0]
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            log.warning("actuator: resuming with restore_callback_states_from_checkpoint: %d ActuatorCallbacks could "
                        "be the one replaced; continuing with the one rebuilt from the checkpoint (no probes). "
                        "Attach the callback with .attach(trainer) to avoid this", len(candidates))
        return None

    def _hand_back(self, predecessor: ActuatorCallback, trainer: Any, args: Any, state: Any, control: Any,
                   **kwargs: Any) -> Any:
        """Put the user's callback back where transformers put this rebuilt one, and start it.

        With ``restore_callback_states_from_checkpoint=True`` transformers replaces every callback
        with one built from the checkpoint (``type(cb)(**state["args"])`` plus its attributes).
        Probes, setters and tokens cannot travel through JSON, so the rebuilt callback hands the
        trainer back to the callback the user configured, which restores the same state from the
        checkpoint itself (``_restore``): one run continues, with its probes."""
        callbacks = trainer.callback_handler.callbacks
        del callbacks[next(i for i, cb in enumerate(callbacks) if cb is self)]
        predecessor._bind(trainer)  # before our old place: call_event still reaches everyone once
        log.info("actuator: resumed with restore_callback_states_from_checkpoint: the configured callback "
                 "continues run %s", self.run_id)
        return predecessor.on_train_begin(args, state, control, **kwargs)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.identification is not None:
            # Before the decisions: at the test's last step the restored value comes first and a
            # decision released at that boundary applies on top of it, instead of being undone.
            value = self.identification.due(state.global_step)
            if value is not None:
                self.setters[self.identification.knob].apply(value)
        self._apply_results(args, state, control)
        self._setters_step_end(state.global_step)
        if self._schedule_pending:
            self._apply_probe_schedule()
        step = state.global_step
        ran = False
        if self.suite is not None and model is not None and self._is_main:
            ran = self._observe(step, model)
        if not ran and self._is_main and self.report_every and step % self.report_every == 0:
            self._submit(step, {})

    def _keep_metrics(self, values: dict[str, Any] | None) -> None:
        for k, v in (values or {}).items():
            name = _metric_name(k)
            if name and isinstance(v, (int, float)) and math.isfinite(v) and name != "epoch":
                self._metrics[name] = float(v)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        self._keep_metrics(logs)
        if logs is None or not self.setters:
            return
        # Knob values in effect (and decisions applied since the last log) go into the trainer's
        # log, so TensorBoard / W&B show them beside the loss.
        extra = {f"actuator/{name}": value for name, value in self.knob_values().items()}
        extra["actuator/decisions"] = float(len(self.applied))
        # The aggregates of a setter's summary (the per-layer ranks stay in the observations).
        extra.update({f"actuator/{k}": v for k, v in self._setter_summaries().items()
                      if not k.startswith("compression.rank.")})
        extra.update(self._log_extra)
        self._log_extra.clear()
        logs.update(extra)
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(extra)

    def on_evaluate(self, args: Any, state: Any, control: Any, model: Any = None,
                    metrics: dict[str, float] | None = None, **kwargs: Any) -> None:
        self._keep_metrics(metrics)
        if self.suite is not None and model is not None and self._is_main:
            self._observe(state.global_step, model, evaluate=True)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self.checkpoints.append((state.global_step, path))
        if self._is_main and self.run_token and os.path.isdir(path):
            # The run token lets a resumed run continue the same run; it is a secret, so it is
            # kept out of trainer_state.json, in its own owner-only file.
            fd = os.open(os.path.join(path, "actuator-token"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(self.run_token)

    # -- checkpointed state (transformers' ExportableState) ----------------------------------
    def state(self) -> dict[str, Any]:
        """Saved by Trainer into each checkpoint's trainer_state.json (JSON).

        ``args`` rebuild an equivalent callback (``ActuatorCallback(**args)``: policy, service URL,
        knob bounds, run name, budgets), which is what transformers does on resume when
        ``restore_callback_states_from_checkpoint=True``; the rebuilt one then hands over to the
        callback configured in the script, with its probes and setters (see :meth:`_hand_back`).
        ``attributes`` are where the run was: its id (the token is kept in an owner-only file
        beside the checkpoint, never in this JSON), sequence number, last decision, knob values
        and the last step at which every guardrail held. Without that flag the configured callback
        restores the same attributes itself (:meth:`_restore`)."""
        policy = self.policy if isinstance(self.policy, str) else self.policy.model_dump(mode="json")
        return {
            "args": _json_safe({
                "policy": policy, "url": self.url, "knobs": self.knob_bounds, "run_name": self.run_name,
                "budget_share": self.budget_share, "timeout": self.timeout, "flush_timeout": self.flush_timeout,
                "register_timeout": self.register_timeout,
                "report_every": self.report_every, "metadata": self.metadata,
            }),
            "attributes": {
                "run_id": self.run_id, "seq": self.seq, "last_decision": self.last_decision,
                "saved_knobs": self.knob_values() if self.setters else {}, "last_ok_step": self.last_ok_step,
                "_from_checkpoint": True,
            },
        }

    def _restore(self, args: Any, state: Any) -> None:
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        if not saved or not state.global_step:
            return
        attrs = saved.get("attributes", {})
        self.seq = int(attrs.get("seq", 0))
        self.last_decision = int(attrs.get("last_decision", 0))
        self.last_ok_step = attrs.get("last_ok_step")
        knobs = attrs.get("saved_knobs", attrs.get("knobs")) or {}  # "knobs": checkpoints before 0.1.1
        for name, value in knobs.items():
            setter = self.setters.get(name)
            if setter is not None and name != "learning_rate":
                # The lr lives in the optimizer/scheduler state the Trainer restores itself.
                setter.apply(float(value))
        token_file = os.path.join(args.output_dir, f"checkpoint-{state.global_step}", "actuator-token")
        if attrs.get("run_id") and os.path.exists(token_file):
            with open(token_file) as fh:
                self.run_id, self.run_token = attrs["run_id"], fh.read().strip()
        log.info("actuator: resumed at step %d (seq %d, last decision %d, knobs %s)", state.global_step,
                 self.seq, self.last_decision, knobs)

    def _close_client(self) -> None:
        if self.client is not None:
            self.client.close()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.sender is None:
            return
        delivered = self.sender.close(self.flush_timeout)
        if not delivered:
            log.warning("actuator: %d observations could not be delivered before train end",
                        self.sender.backlog)
        if self.run_id and self.client is not None and self.run_state == "running":
            try:
                self.client.finish(self.run_id, token=self.run_token)
            except (ServiceUnavailable, RequestRejected) as exc:
                log.warning("actuator: could not mark the run finished: %s", exc)
        self._close_client()

    # -- the loop ----------------------------------------------------------------------------
    def knob_values(self) -> dict[str, float]:
        return {name: float(s.read()) for name, s in self.setters.items()}

    def _observe(self, step: int, model: Any, *, evaluate: bool = False, baseline: bool = False) -> bool:
        report = self.suite.run(model, step, evaluate=evaluate, baseline=baseline)
        if report is None:
            return False
        probes = {k: v for k, v in report.values.items() if not k.startswith("probe_") and math.isfinite(v)}
        costs = {k: v for k, v in report.values.items() if k.startswith("probe_") and math.isfinite(v)}
        self._submit(step, probes, costs)
        return True

    def _setters_step_end(self, step: int) -> None:
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

    @staticmethod
    def _setter_summary(setter: Any) -> dict[str, float]:
        """A setter's report of what is in effect beyond its value (``summary()``, optional):
        finite floats under valid observation names."""
        fn = getattr(setter, "summary", None)
        if fn is None:
            return {}
        try:
            values = fn()
        except Exception as exc:  # noqa: BLE001 - telemetry never stops training
            log.warning("actuator: knob %s: summary failed: %s", getattr(setter, "name", "?"), exc)
            return {}
        return {k: float(v) for k, v in values.items()
                if _metric_name(k) == k and isinstance(v, (int, float)) and math.isfinite(v)}

    def _setter_summaries(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for setter in self.setters.values():
            out.update(self._setter_summary(setter))
        return out

    def _submit(self, step: int, probes: dict[str, float], extra_metrics: dict[str, float] | None = None) -> None:
        metrics = {**self._metrics, **self._setter_summaries(), **(extra_metrics or {})}
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

    def _apply_results(self, args: Any, state: Any, control: Any) -> None:
        decisions: list[dict[str, Any]] = []
        halt = rollback = False
        if self._is_main and self.sender is not None:
            for result in self.sender.results():
                for d in result.decisions:
                    if d.number > self.last_decision:
                        decisions.append(d.model_dump(mode="json"))
                        self.last_decision = d.number
                halt = halt or result.state == "halted"
                rollback = rollback or any(a.type == "rollback" for a in result.actions)
                if not result.breached and result.last_step is not None:
                    self.last_ok_step = max(self.last_ok_step or 0, result.last_step)
                for a in result.actions:
                    if a.type == "alert":
                        log.warning("actuator: guardrail alert: %s", a.reason)
            self.sender.last_decision = self.last_decision
        decisions, halt, rollback = self._broadcast(decisions, halt, rollback)
        if rollback and not halt:
            halt = not self._rollback(args, state)
        for d in decisions:
            self._apply(d, state.global_step)
        if halt and self.run_state != "halted":
            self.run_state = "halted"
            log.warning("actuator: the controller halted this run at step %d; saving and stopping",
                        state.global_step)
            control.should_save = True
            control.should_training_stop = True

    def _rollback(self, args: Any, state: Any) -> bool:
        """Restore the last checkpoint at which every guardrail held; False if there is none."""
        healthy = [(s, p) for s, p in self.checkpoints if self.last_ok_step is not None and s <= self.last_ok_step
                   and os.path.isdir(p)]
        unsupported = rollback_unsupported(self.trainer)
        if unsupported or not healthy:
            log.error("actuator: rollback ordered at step %d but %s; halting instead", state.global_step,
                      unsupported or "no checkpoint was saved while every guardrail held")
            return False
        step, path = healthy[-1]
        load_checkpoint(self.trainer, path)  # weights in place; optimizer moments and schedule of that step
        self.rollbacks.append({"at_step": state.global_step, "to_step": step, "checkpoint": path})
        self._log_extra["actuator/rollback_to_step"] = float(step)
        log.warning("actuator: guardrail breach: rolled back to %s (step %d) at step %d; training continues",
                    path, step, state.global_step)
        return True

    def _broadcast(self, decisions: list[dict[str, Any]], halt: bool,
                   rollback: bool) -> tuple[list[dict[str, Any]], bool, bool]:
        """Every rank applies rank 0's decisions at the same step boundary."""
        payload = self._from_rank0({"decisions": decisions, "halt": halt, "rollback": rollback})
        return payload["decisions"], payload["halt"], payload["rollback"]

    @staticmethod
    def _from_rank0(value: Any) -> Any:
        """``value`` as rank 0 has it, on every rank (itself when not distributed)."""
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover
            return value
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return value
        payload = [value]
        dist.broadcast_object_list(payload, src=0)
        return payload[0]

    def _apply_probe_schedule(self) -> None:
        """The policy names probes and how often they run. A policy's word wins over the
        constructor's, so changing a stored policy needs no change to the training script. A
        preset's intervals are defaults instead, fitted to ``max_steps``
        (``default_probes.fitted_intervals``), for the probes whose ``every=`` was not given."""
        self._schedule_pending = False
        doc = self.policy_doc
        if doc is None:
            return
        from .default_probes import controller_probes, fitted_intervals

        if self.suite is not None:
            self.suite.priority |= controller_probes(doc)  # a controller's readings come first
        if not doc.probes:
            return
        if self._from_preset:
            intervals = fitted_intervals(doc, self._max_steps)
        else:
            intervals = {spec.name: spec.every for spec in doc.probes}
        available = {p.name: p for p in (self.suite.probes if self.suite is not None else [])}
        for spec in doc.probes:
            probe = available.get(spec.name)
            if probe is None:
                if spec.name not in self._unbuilt:  # those were named at train() start
                    log.warning("actuator: the policy asks for probe %r, which this run was not given "
                                "(pass it in probes=[...]); it will not be measured", spec.name)
                continue
            if not (self._from_preset and getattr(probe, "every_given", True)):
                probe.every = intervals[spec.name]
            probe.on_evaluate = spec.on_evaluate

    def _apply(self, decision: dict[str, Any], step: int) -> None:
        d = DecisionPublic.model_validate(decision)
        setter, spec = self.setters.get(d.knob), self.specs.get(d.knob)
        if setter is None or spec is None:
            log.warning("actuator: decision %d names knob %r, which this run has no setter for", d.number, d.knob)
            self._acknowledge(d.number, step, None, f"this run has no setter for knob {d.knob!r}")
            return
        if self.identification is not None and self.identification.holds(d.knob, step):
            log.info("actuator: decision %d on %s set aside: identification runs until step %d", d.number,
                     d.knob, self.identification.end)
            self._acknowledge(d.number, step, None, f"identification holds {d.knob} until step "
                                                    f"{self.identification.end}")
            return
        value = self._guard(spec, float(setter.read()), d.new_value)
        applied = float(setter.apply(value))
        entry = {"number": d.number, "step": step, "knob": d.knob, "ordered": d.new_value,
                 "applied": applied, "reason": d.reason}
        summary = self._setter_summary(setter)
        if summary:
            entry["summary"] = summary  # what the decision put in effect (compression: params, ranks)
        self.applied.append(entry)
        self._acknowledge(d.number, step, applied, None)
        self._log_extra[f"actuator/{d.knob}_ordered"] = d.new_value
        log.info("actuator: step %d: %s -> %.6g (decision %d: %s)", step, d.knob, applied, d.number, d.reason)

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
        self.sender.acknowledge(ack)

    @staticmethod
    def _guard(spec: KnobSpec, current: float, ordered: float) -> float:
        """Defence in depth: never apply a value outside the run's bounds or rate limit."""
        value = min(max(ordered, spec.min), spec.max)
        if spec.max_step is not None and current > 0 and spec.scale == "log":
            lo, hi = current * math.exp(-spec.max_step), current * math.exp(spec.max_step)
            value = min(max(value, lo), hi)
        elif spec.max_step is not None and spec.scale != "log":
            value = min(max(value, current - spec.max_step), current + spec.max_step)
        if spec.scale == "integer":
            value = float(round(value))
        return value
