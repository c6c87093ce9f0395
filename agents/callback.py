"""ActuatorCallback: one callback that puts a Hugging Face ``Trainer`` (or a TRL trainer, which
subclasses it) under closed-loop control.

    trainer = Trainer(...)
    ActuatorCallback(policy="sft-drift", probes=[KLDrift(prompts, tok)]).attach(trainer)
    trainer.train()

What happens, step by step (see DESIGN.md, "The loop"):
1. ``on_train_begin``: the policy is validated locally, knob setters are bound (the learning
   rate from the trainer's optimizer and scheduler, others given by the user), probes are set
   up (the drift reference is snapshotted here), and a background sender is started. The run is
   registered with the service from that thread: training never waits on the network.
2. ``on_step_end`` (a step boundary): results that came back are applied — knob decisions are
   clamped to the run's bounds and rate limit on this side too, then written through the
   setters, and the value read back is what the next observation reports. Then due probes run,
   and the observation is handed to the sender.
3. Distributed runs: rank 0 talks to the service; decisions are broadcast so every rank applies
   the same values at the same step.
4. The service down: training continues with the last values; one warning per outage.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from typing import Any

from actuator._exceptions import ConfigError, RequestRejected, ServiceUnavailable
from actuator.client import ActuatorClient
from actuator.policy import PolicyDocument, load_policy, load_preset, protect_policy
from actuator.schemas import DecisionPublic, KnobSpec, ObservationCreate, RunCreate

from .identification import IdentificationMode
from .knobs import KnobSetter, LearningRateKnob
from .sender import BackgroundSender

__all__ = ["ActuatorCallback", "default_knob_spec"]

log = logging.getLogger("actuator.agents")

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState
except ImportError as exc:  # pragma: no cover - depends on install
    raise ImportError("ActuatorCallback needs transformers: `pip install 'actuator[train]'`") from exc


def default_knob_spec(name: str, value: float) -> dict[str, Any]:
    """Bounds a user gets when they name a knob without bounds.

    The learning rate the user configured is its ceiling: a controller may slow a run down to
    protect a capability but never, by default, train faster than the user chose (a 10x lr is
    how runs diverge). Betas may rise 10x (a larger beta keeps the policy closer to its
    reference, the conservative direction) and fall 100x.
    """
    if name == "learning_rate" and value > 0:
        return {"min": value / 100.0, "max": value, "scale": "log", "max_step": 0.7}
    if name in ("kl_beta", "gkd_beta") and value > 0:
        return {"min": value / 100.0, "max": value * 10.0, "scale": "log", "max_step": 0.7}
    if name == "kl_weight":
        # A Lagrange multiplier: 0 is "anchor off"; at 2 the anchor already outweighs a typical
        # task loss (forgetting benchmark: w = 3 costs a third of the task); 0.25 per decision.
        return {"min": 0.0, "max": 2.0, "scale": "linear", "max_step": 0.25}
    if name == "distill_lambda":
        return {"min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.2}
    if name == "rank":
        return {"min": 1.0, "max": max(1.0, value), "scale": "integer", "max_step": None}
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
        timeout: HTTP timeout of one request, in seconds (the sender's, never training's).
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
        flush_timeout: float = 10.0,
        report_every: int = 0,
        metadata: dict[str, Any] | None = None,
        identify: IdentificationMode | dict[str, Any] | None = None,
    ) -> None:
        if (policy is None) == (protect is None):
            raise ConfigError("policy: give a policy (name, preset:NAME, document) or protect={...}, not both")
        self._protect = (dict(protect), on_drift, on_breach) if protect is not None else None
        if protect is not None:
            self.policy: str | PolicyDocument = protect_policy(protect, on_drift=on_drift, on_breach=on_breach)
        elif isinstance(policy, str) and policy.startswith("preset:"):
            self.policy = load_preset(policy.removeprefix("preset:"))
        elif isinstance(policy, str) and "\n" not in policy and not policy.endswith((".yaml", ".yml", ".json")):
            self.policy = policy  # a stored policy on the service
        else:
            self.policy = load_policy(policy)  # PolicyError now, not mid-run
        self.url = url or os.environ.get("ACTUATOR_URL", "http://127.0.0.1:8000")
        self.token = token or os.environ.get("ACTUATOR_TOKEN")
        self.knob_bounds = dict(knobs or {"learning_rate": {}})
        self.extra_setters = {s.name: s for s in (setters or [])}
        self.run_name = run_name
        self.timeout, self.flush_timeout = timeout, flush_timeout
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
        """Bind to ``trainer`` (callbacks are not given the trainer object) and register."""
        self.trainer = trainer
        # Right after DefaultFlowCallback, so our on_log runs before TensorBoard/W&B/printer
        # callbacks and the knob values we add to the logs reach them.
        callbacks = trainer.callback_handler.callbacks
        if self not in callbacks:
            callbacks.insert(min(1, len(callbacks)), self)
        return self

    def _add_policy_knobs(self) -> None:
        """A policy that drives ``kl_weight`` brings its knob when the trainer has a KL anchor
        (``preset:protect-capability`` works with ``knobs`` left alone), and ``protect={...}``
        holds its absolute budgets with the anchor's weight when there is one."""
        if getattr(self.trainer, "kl_anchor", None) is None:
            return
        if self._protect is not None and self.run_id is None:
            protect, on_drift, on_breach = self._protect
            self.policy = self.policy_doc = protect_policy(protect, on_drift=on_drift, on_breach=on_breach,
                                                           anchor=True)
        if self.policy_doc is None:
            return
        if any(c.knob == "kl_weight" for c in self.policy_doc.controllers):
            self.knob_bounds.setdefault("kl_weight", {})

    def _bind_setters(self, optimizer: Any, lr_scheduler: Any) -> None:
        for name in self.knob_bounds:
            if name in self.extra_setters:
                self.setters[name] = self.extra_setters[name]
            elif name == "kl_weight":
                anchor = getattr(self.trainer, "kl_anchor", None)
                if anchor is None:
                    raise ConfigError("knobs.kl_weight: the trainer has no KL anchor; build it with "
                                      "actuator.agents.anchor.anchor_trainer(YourTrainer)(..., kl_anchor=KLAnchor(texts, "
                                      "tokenizer)) and attach with .attach(trainer), or pass "
                                      "setters=[KLAnchorKnob(anchor)] for your own loop")
                from .anchor import KLAnchorKnob

                self.setters[name] = KLAnchorKnob(anchor)
            elif name == "learning_rate":
                if optimizer is None:
                    raise ConfigError("learning_rate: the trainer has no optimizer yet")
                self.setters[name] = LearningRateKnob(optimizer, _unwrap_scheduler(lr_scheduler))
            else:
                raise ConfigError(f"knobs.{name}: no setter for this knob; pass setters=[...] "
                                  f"(e.g. actuator.agents.knobs for kl_beta, compression.RankKnob for rank)")
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

    # -- registration (runs in the sender thread) ----------------------------------------------
    def _register(self) -> tuple[str, str]:
        assert self.client is not None
        policy = self.policy if isinstance(self.policy, str) else self.policy.model_dump(mode="json")
        body = RunCreate(name=self.run_name or "run", policy=policy, knobs=list(self.specs.values()),
                         metadata={k: v for k, v in self.metadata.items()
                                   if isinstance(v, (str, int, float, bool)) or v is None})
        if self.run_id is not None and self.run_token is not None:
            return self.run_id, self.run_token  # resumed from a checkpoint: the same run continues
        created = self.client.register_run(body)
        self.run_id, self.run_token = created.id, created.token
        self.policy_doc = PolicyDocument.model_validate(created.policy)
        self._schedule_pending = True
        log.info("actuator: run %s registered (policy %s v%d)", created.id, created.policy_name,
                 created.policy_version)
        return created.id, created.token

    # -- trainer events --------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> None:
        trainer = self.trainer
        optimizer = optimizer if optimizer is not None else getattr(trainer, "optimizer", None)
        lr_scheduler = lr_scheduler if lr_scheduler is not None else getattr(trainer, "lr_scheduler", None)
        self._is_main = bool(getattr(state, "is_world_process_zero", True))
        self._add_policy_knobs()
        self._bind_setters(optimizer, lr_scheduler)
        if self.identification is not None:
            knob = self.identification.knob
            self.identification.bind(self.specs[knob], float(self.setters[knob].read()), state.global_step)
        self._restore(args, state)
        if self.run_name is None:
            self.run_name = (getattr(args, "run_name", None) or os.path.basename(str(args.output_dir)) or "run")[:128]
        if self.suite is not None and model is not None:
            self.suite.setup(model)
        if self._is_main:
            self.client = ActuatorClient(self.url, token=self.token, timeout=self.timeout)
            self.sender = BackgroundSender(self.client, register=self._register)
            if self.suite is not None and model is not None:
                self._observe(state.global_step, model, force=True)  # the baseline at step 0

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.identification is not None:
            # Before the decisions: at the test's last step the restored value comes first and a
            # decision released at that boundary applies on top of it, instead of being undone.
            value = self.identification.due(state.global_step)
            if value is not None:
                self.setters[self.identification.knob].apply(value)
        self._apply_results(args, state, control)
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
        """Saved by Trainer into the checkpoint's trainer_state.json; restored by us on resume
        (leave ``restore_callback_states_from_checkpoint`` off: this callback holds probes and
        setters that cannot be rebuilt from JSON)."""
        return {"args": {}, "attributes": {
            "run_id": self.run_id, "seq": self.seq, "last_decision": self.last_decision,
            "knobs": self.knob_values() if self.setters else {}, "last_ok_step": self.last_ok_step,
        }}

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
        for name, value in (attrs.get("knobs") or {}).items():
            setter = self.setters.get(name)
            if setter is not None and name != "learning_rate":
                # The lr lives in the optimizer/scheduler state the Trainer restores itself.
                setter.apply(float(value))
        token_file = os.path.join(args.output_dir, f"checkpoint-{state.global_step}", "actuator-token")
        if attrs.get("run_id") and os.path.exists(token_file):
            with open(token_file) as fh:
                self.run_id, self.run_token = attrs["run_id"], fh.read().strip()
        log.info("actuator: resumed at step %d (seq %d, last decision %d, knobs %s)", state.global_step,
                 self.seq, self.last_decision, attrs.get("knobs"))

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
        self.client.close() if self.client is not None else None

    # -- the loop ----------------------------------------------------------------------------
    def knob_values(self) -> dict[str, float]:
        return {name: float(s.read()) for name, s in self.setters.items()}

    def _observe(self, step: int, model: Any, *, evaluate: bool = False, force: bool = False) -> bool:
        report = self.suite.run(model, step, evaluate=evaluate, force=force)
        if report is None:
            return False
        probes = {k: v for k, v in report.values.items() if not k.startswith("probe_") and math.isfinite(v)}
        costs = {k: v for k, v in report.values.items() if k.startswith("probe_") and math.isfinite(v)}
        self._submit(step, probes, costs)
        return True

    def _submit(self, step: int, probes: dict[str, float], extra_metrics: dict[str, float] | None = None) -> None:
        metrics = {**self._metrics, **(extra_metrics or {})}
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
        if self.trainer is None or not healthy:
            log.error("actuator: rollback ordered at step %d but %s; halting instead", state.global_step,
                      "the callback is not attached to a trainer (use .attach(trainer))" if self.trainer is None
                      else "no checkpoint was saved while every guardrail held")
            return False
        step, path = healthy[-1]
        self.trainer._load_from_checkpoint(path)  # weights, in place
        self.trainer._load_optimizer_and_scheduler(path)  # moments and schedule of that step
        self.rollbacks.append({"at_step": state.global_step, "to_step": step, "checkpoint": path})
        self._log_extra["actuator/rollback_to_step"] = float(step)
        log.warning("actuator: guardrail breach: rolled back to %s (step %d) at step %d; training continues",
                    path, step, state.global_step)
        return True

    def _broadcast(self, decisions: list[dict[str, Any]], halt: bool,
                   rollback: bool) -> tuple[list[dict[str, Any]], bool, bool]:
        """Every rank applies rank 0's decisions at the same step boundary."""
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover
            return decisions, halt, rollback
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return decisions, halt, rollback
        payload = [{"decisions": decisions, "halt": halt, "rollback": rollback}]
        dist.broadcast_object_list(payload, src=0)
        return payload[0]["decisions"], payload[0]["halt"], payload[0]["rollback"]

    def _apply_probe_schedule(self) -> None:
        """The policy names probes and how often they run: the service's word wins over the
        constructor's, so changing a policy needs no change to the training script."""
        self._schedule_pending = False
        if self.policy_doc is None or not self.policy_doc.probes:
            return
        available = {p.name: p for p in (self.suite.probes if self.suite is not None else [])}
        for spec in self.policy_doc.probes:
            probe = available.get(spec.name)
            if probe is None:
                log.warning("actuator: the policy asks for probe %r, which this run was not given "
                            "(pass it in probes=[...]); it will not be measured", spec.name)
                continue
            probe.every, probe.on_evaluate = spec.every, spec.on_evaluate

    def _apply(self, decision: dict[str, Any], step: int) -> None:
        d = DecisionPublic.model_validate(decision)
        setter, spec = self.setters.get(d.knob), self.specs.get(d.knob)
        if setter is None or spec is None:
            log.warning("actuator: decision %d names knob %r, which this run has no setter for", d.number, d.knob)
            return
        if self.identification is not None and self.identification.holds(d.knob, step):
            log.info("actuator: decision %d on %s set aside: identification runs until step %d", d.number,
                     d.knob, self.identification.end)
            return
        value = self._guard(spec, float(setter.read()), d.new_value)
        applied = float(setter.apply(value))
        entry = {"number": d.number, "step": step, "knob": d.knob, "ordered": d.new_value,
                 "applied": applied, "reason": d.reason}
        self.applied.append(entry)
        self._log_extra[f"actuator/{d.knob}_ordered"] = d.new_value
        log.info("actuator: step %d: %s -> %.6g (decision %d: %s)", step, d.knob, applied, d.number, d.reason)

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
