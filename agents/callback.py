"""ActuatorCallback: a Hugging Face ``Trainer`` (or a TRL trainer, which subclasses it) under
closed-loop control: the adapter between the trainer's events and a :class:`ControlSession`.

    trainer = GRPOTrainer(..., callbacks=[ActuatorCallback("preset:rl-kl")])
    trainer.train()

``Trainer(callbacks=[cb])`` and ``cb.attach(trainer)`` are the same: the callback finds its trainer
at ``on_init_end`` and puts itself before the ``report_to`` loggers.

The session (agents/session.py) holds the run: registration, the sender, decisions guarded,
applied and acknowledged, identification and the probe schedule. What is the trainer's is here:

1. ``on_train_begin``: the policy is resolved (a stored one is fetched) and brings its knobs; each
   knob's setter is found from the trainer (learning rate: optimizer and scheduler; ``kl_beta``:
   TRL DPO/GRPO/RLOO; ``distill_lambda`` / ``gkd_beta`` / ``onpolicy_fraction`` / ``divergence_mix`` /
   ``distill_temperature``: distillation and GKD trainers; ``rank``:
   factorised layers or LoRA; ``kl_weight``: the KL anchor) unless ``setters`` gives one; the run
   is registered (one request). A refusal (the service's 4xx: a bad policy, knob or token) raises
   :class:`~actuator.ConfigError` before the first step; anything else (unreachable, an answer
   that cannot be read) lets training start without control, with a warning, and the background
   sender registers the run when the service answers. The probes the policy names that the run was
   not given are built from the trainer's tokenizer and shipped data (``default_probes``; one a
   controller needs and nothing shipped can stand in for is a ConfigError), a preset's probe
   intervals are fitted to ``max_steps``, then probes are set up (the drift reference is
   snapshotted here), the sender is started and the baseline is read.
2. ``on_step_end`` (a step boundary): results that came back are applied through the session —
   knob decisions are clamped to the run's bounds and rate limit on this side too, then written
   through the setters, and the value read back is what the next observation reports. A rollback
   loads the last healthy checkpoint. Then due probes run, and the observation is handed to the
   sender: training never waits on the network.
3. Distributed runs: rank 0 talks to the service; its configuration, refusals and decisions are
   broadcast so every rank applies the same values at the same step.
4. Checkpoints carry where the run was; a resume continues the same run (``state``, ``_restore``,
   and the hand-back of ``restore_callback_states_from_checkpoint``).
5. The service down: training continues with the last values; one warning per outage.
"""

from __future__ import annotations

import logging
import os
import warnings
import weakref
from dataclasses import replace
from typing import Any

from actuator._exceptions import ConfigError
from actuator.policy import PolicyDocument, protect_policy

from ._hf_compat import (find_trainer, fsdp_version, load_checkpoint, load_deepspeed_checkpoint, rollback_unsupported,
                         run_before_loggers, sharding_unsupported)
from .checkpoints import CheckpointKeeper
from .identification import IdentificationMode
from .knobs import KnobSetter, setter_for
from .session import Connection, ControlSession, Protect, Reporting, RunInfo
from .sharded import SHARDED_DIR, check_on_every_rank, from_rank0, load_sharded, rank_and_world, save_sharded

__all__ = ["ActuatorCallback", "Connection", "Protect", "Reporting", "RunInfo"]

log = logging.getLogger("actuator.agents")

try:
    from transformers import TrainerCallback
    from transformers.trainer_callback import ExportableState
except ImportError as exc:
    from .models import training_stack_missing

    raise training_stack_missing("ActuatorCallback", exc) from exc

# Every ActuatorCallback alive, so that one transformers rebuilt from a checkpoint can find the one
# the script configured (see ActuatorCallback._predecessor).
_LIVE: weakref.WeakSet[ActuatorCallback] = weakref.WeakSet()


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


# The arguments before ``Connection`` / ``RunInfo`` / ``Reporting`` / ``Protect`` grouped them:
# argument -> its group; each group's new form and class, as the warning names them.
_LEGACY = {
    "url": "connection", "token": "connection", "timeout": "connection", "register_timeout": "connection",
    "flush_timeout": "connection",
    "run_name": "run", "metadata": "run",
    "budget_share": "reporting", "report_every": "reporting",
    "on_drift": "protect", "on_breach": "protect",
}
_NEW_FORM = {
    "connection": "connection=Connection(url=..., token=..., timeout=..., register_timeout=..., flush_timeout=...)",
    "run": "run=RunInfo(name=..., metadata=...)",
    "reporting": "reporting=Reporting(budget_share=..., report_every=...)",
    "protect": "protect=Protect({...}, on_drift=..., on_breach=...)",
}
_CLASS = {"connection": "Connection", "run": "RunInfo", "reporting": "Reporting", "protect": "Protect"}
_FIELD = {"run_name": "name"}  # a legacy argument whose field in its group has another name
_WARNED: set[str] = set()  # each group's deprecation is said once per process


def _legacy_groups(legacy: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The old keyword arguments by the group that replaces them (a FutureWarning, once per group)."""
    unknown = sorted(set(legacy) - set(_LEGACY))
    if unknown:
        raise TypeError(f"ActuatorCallback() got an unexpected keyword argument {unknown[0]!r}")
    groups: dict[str, dict[str, Any]] = {}
    for name, value in legacy.items():
        groups.setdefault(_LEGACY[name], {})[_FIELD.get(name, name)] = value
    for group in groups:
        if group not in _WARNED:
            _WARNED.add(group)
            used = ", ".join(f"{k}=" for k in legacy if _LEGACY[k] == group)
            warnings.warn(f"ActuatorCallback({used}...) is deprecated and will be removed: pass {_NEW_FORM[group]} "
                          f"(from actuator.agents.callback import {_CLASS[group]})",
                          FutureWarning, stacklevel=3)
    return groups


def _saves_checkpoints(args: Any) -> bool:
    """Whether the trainer's arguments save checkpoints (``save_strategy`` other than "no")."""
    strategy = getattr(args, "save_strategy", "steps")
    return str(getattr(strategy, "value", strategy)) != "no"


def _warn_if_fewer_processes(args: Any) -> None:
    """Say when the launcher asked for more processes than this run trains on: ``WORLD_SIZE`` above
    the process group's size, or ``accelerate launch --cpu --num_processes N`` (it runs one process
    on CPU unless given an MPI hostfile, and leaves MASTER_ADDR/MASTER_PORT set for the N asked)."""
    world = rank_and_world()[1]
    trainer_world = int(getattr(args, "world_size", 1) or 1)
    seen = max(world, trainer_world)
    try:
        asked = int(os.environ.get("WORLD_SIZE", "0") or 0)
    except ValueError:
        asked = 0
    if asked > seen:
        log.warning("actuator: WORLD_SIZE=%d but this run trains on %d process(es): the process group was not "
                    "formed as launched; every process trains (and is controlled) alone", asked, seen)
    elif (seen == 1 and not asked and os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("true", "1")
          and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
        log.warning("actuator: launched by `accelerate launch --cpu` with more than one process asked "
                    "(MASTER_ADDR/MASTER_PORT are set), but this run trains on 1 process: accelerate starts one "
                    "process under --cpu unless given --mpirun_hostfile. For N CPU processes drop --cpu: `accelerate "
                    "launch --multi_gpu --num_processes N script.py --use_cpu`, or `torchrun --nproc_per_node N "
                    "script.py --use_cpu` (docs/how-to/sharded-training.md)")


def _session_attribute(name: str, doc: str) -> property:
    """An attribute of the callback that is its session's (``cb.run_id`` is ``cb.session.run_id``)."""
    return property(lambda self: getattr(self.session, name),
                    lambda self, value: setattr(self.session, name, value), doc=doc)


class ActuatorCallback(TrainerCallback, ExportableState):
    """Stream probes to the controller service and apply its decisions at step boundaries.

    Args:
        policy: a stored policy's name (``"sft-drift"`` or ``"sft-drift@3"``), a shipped preset
            (``"preset:sft-capability"``), or a policy document (dict, YAML/JSON path,
            :class:`PolicyDocument`) registered with the run.
        protect: the one-line form instead of ``policy``:
            ``protect={"hotpotqa.gold_logprob": "-5%", "kl_drift": 0.1}`` builds one guardrail
            per probe; drift probes ``adjust``, the others ``rollback`` (restore the last checkpoint
            at which every guardrail held and continue with a damped learning rate). Other actions:
            ``protect=Protect({...}, on_drift="adjust", on_breach="halt")``.
        probes: a list of probes or a ``ProbeSuite`` (``actuator.agents.probes``).
        knobs: bounds per knob, ``{"learning_rate": {"min": 1e-6, "max": 1e-3, "max_step": 0.5}}``;
            a knob named without bounds gets :func:`actuator.catalogue.default_knob_spec`. Default: learning_rate.
        setters: extra knob setters (``KnobSetter``) for knobs other than the learning rate.
        connection: :class:`Connection`: the service's ``url`` (default ``$ACTUATOR_URL`` or
            ``http://127.0.0.1:8000``), admin ``token`` for registration (``$ACTUATOR_TOKEN``),
            ``timeout`` per request, ``register_timeout`` at ``train()`` start, ``flush_timeout`` at
            its end. A URL alone may be given as the string.
        run: :class:`RunInfo`: the run's ``name`` (default: the trainer's ``run_name`` / output
            dir) and ``metadata``. A name alone may be given as the string.
        reporting: :class:`Reporting`: ``budget_share``, the largest share of wall time probes may
            take (default 10%), and ``report_every``, training metrics every N steps without
            probes too (0: only with probes).
        identify: identification mode for a short pre-run, ``{"knob": "learning_rate", "size": 0.5,
            "hold": 10, "length": 40}`` (or an :class:`~actuator.agents.identification.IdentificationMode`):
            the knob is stepped by ``size`` (log units for a log knob) after ``hold`` steps, held for
            ``length`` steps and restored; the service's decisions on it wait until then. Then
            ``actuator policy tune --run RUN_ID --controller NAME`` fits the run.

    The arguments before these groups (``url=``, ``token=``, ``timeout=``, ``register_timeout=``,
    ``flush_timeout=``, ``run_name=``, ``metadata=``, ``budget_share=``, ``report_every=``,
    ``on_drift=``, ``on_breach=``) still work and warn once (FutureWarning) with the new form.
    """

    def __init__(
        self,
        policy: str | dict[str, Any] | PolicyDocument | os.PathLike[str] | None = None,
        *,
        protect: Protect | dict[str, float | str] | None = None,
        probes: Any = None,
        knobs: dict[str, dict[str, Any]] | None = None,
        setters: list[KnobSetter] | None = None,
        connection: Connection | dict[str, Any] | str | None = None,
        run: RunInfo | dict[str, Any] | str | None = None,
        reporting: Reporting | dict[str, Any] | None = None,
        identify: IdentificationMode | dict[str, Any] | None = None,
        **legacy: Any,
    ) -> None:
        groups = _legacy_groups(legacy)
        if (policy is None) == (protect is None):
            raise ConfigError("policy: give a policy (name, preset:NAME, document) or protect={...}, not both")
        if protect is None and "protect" in groups:
            raise ConfigError("on_drift / on_breach: they go with protect={...}: "
                              "protect=Protect({...}, on_drift=..., on_breach=...)")
        self._protect = replace(Protect.of(protect), **groups.get("protect", {})) if protect is not None else None
        if self._protect is not None:
            p = self._protect
            policy = protect_policy(dict(p.budgets), on_drift=p.on_drift, on_breach=p.on_breach)
        self.session = ControlSession(
            policy, setters=setters or [], knobs=knobs or {"learning_rate": {}}, probes=probes,
            connection=replace(Connection.of(connection), **groups.get("connection", {})),
            run=replace(RunInfo.of(run), **groups.get("run", {})),
            reporting=replace(Reporting.of(reporting), **groups.get("reporting", {})), identify=identify)
        self.trainer: Any = None
        self.checkpoints: list[tuple[int, str]] = []  # (step, dir) saved during this run
        self.rollbacks: list[dict[str, Any]] = []
        self.keeper = CheckpointKeeper()  # REWIND HOOK: the policy's rewind section (agents/checkpoints.py)
        self._started = False  # on_train_begin ran
        self.sharded = False  # FSDP2 or DeepSpeed ZeRO-2/3: probes run on every rank in lockstep
        self.deepspeed = False  # DeepSpeed: checkpoints and rollbacks are the engine's
        _LIVE.add(self)

    # Set through transformers' ExportableState restore (``state()["attributes"]``): this instance
    # was rebuilt from a checkpoint and should hand over to the one the user configured.
    _from_checkpoint = False

    # The run's state is its session's; these names are kept for scripts and reports.
    policy = _session_attribute("policy", "The policy: a stored policy's name or its document.")
    policy_doc = _session_attribute("policy_doc", "The policy document in effect (None until resolved).")
    knob_bounds = _session_attribute("knob_bounds", "Bounds given per knob (and the knobs the policy brings).")
    extra_setters = _session_attribute("extra_setters", "The setters given, by knob name.")
    identification = _session_attribute("identification", "The identification pre-run, if any.")
    suite = _session_attribute("suite", "The ProbeSuite (None without probes).")
    setters = _session_attribute("setters", "Each knob's setter (bound at train() start).")
    specs = _session_attribute("specs", "Each knob's KnobSpec as registered.")
    sender = _session_attribute("sender", "The background sender (rank 0, from train() start).")
    client = _session_attribute("client", "The HTTP client (rank 0).")
    run_id = _session_attribute("run_id", "The run's id once registered.")
    run_token = _session_attribute("run_token", "The run's agent token once registered.")
    run_name = _session_attribute("run_name", "The run's name.")
    run_state = _session_attribute("run_state", "running, or halted once the controller halted the run.")
    seq = _session_attribute("seq", "The next observation's sequence number.")
    last_decision = _session_attribute("last_decision", "The number of the last decision received.")
    last_ok_step = _session_attribute("last_ok_step", "The latest observed step at which every guardrail held.")
    applied = _session_attribute("applied", "Decisions applied, for logs and reports (the latest 1,000 whole).")
    history = _session_attribute("history", "What was observed, for the caller's own tables.")
    _is_main = _session_attribute("main", "Whether this process talks to the service (rank 0).")
    _metrics = _session_attribute("metrics", "The latest training metrics, sent with the next observation.")

    @property
    def url(self) -> str:
        return self.session.url

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
        wanted = "kl_weight" in self.session.policy_knobs() | set(self.knob_bounds)
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

    def _protect_with_anchor(self) -> None:
        """``protect={...}`` holds its absolute budgets with the KL anchor's weight when the trainer
        has one. (Then the policy brings its knobs, as every policy does: ``preset:rl-kl`` declares
        ``kl_beta``, ``preset:compress-ppl`` ``rank``, ... with default bounds unless ``knobs`` gives
        them; their setters are found from the trainer: ``actuator.agents.knobs.setter_for``.)"""
        if getattr(self.trainer, "kl_anchor", None) is not None and self._protect is not None and self.run_id is None:
            p = self._protect
            self.policy = self.policy_doc = protect_policy(dict(p.budgets), on_drift=p.on_drift,
                                                           on_breach=p.on_breach, anchor=True)

    def _bind_setters(self, optimizer: Any, lr_scheduler: Any, model: Any = None) -> None:
        """Each knob's setter from the trainer unless ``setters`` gave one; the session makes the specs."""
        self.session.bind_knobs({name: setter_for(name, trainer=self.trainer, optimizer=optimizer,
                                                  lr_scheduler=lr_scheduler, model=model)
                                 for name in self.knob_bounds if name not in self.extra_setters})
        check_on_every_rank(self.session.setters)  # an acknowledged value is the one every rank holds

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
        session = self.session
        trainer = self.trainer
        if trainer is not None and (sharded := sharding_unsupported(trainer)):
            raise ConfigError(sharded)
        self.deepspeed = bool(getattr(trainer, "is_deepspeed_enabled", False))
        self.sharded = trainer is not None and (fsdp_version(trainer) == 2 or self.deepspeed)
        optimizer = optimizer if optimizer is not None else getattr(trainer, "optimizer", None)
        lr_scheduler = lr_scheduler if lr_scheduler is not None else getattr(trainer, "lr_scheduler", None)
        # rank 0 of the process group (a model fully_shard-ed before a Trainer that sees one process
        # leaves every rank "process zero")
        main = bool(getattr(state, "is_world_process_zero", True)) and rank_and_world()[0] == 0
        # every rank takes rank 0's knobs; sharded, its document too: every rank builds the probes rank 0 runs
        session.open_agreed(main=main, collective=True, with_doc=self.sharded, prepare=self._protect_with_anchor)
        self._anchor_pairs(args, state, model)
        self._bind_setters(optimizer, lr_scheduler, model)
        failure = None
        if main or self.sharded:
            try:
                self._complete_probes()
            except ConfigError as exc:
                failure = exc
        self._stop_if_refused(failure if main else None)
        if self.sharded and self.suite is not None:
            self.suite.lockstep = from_rank0
        max_steps = int(getattr(state, "max_steps", 0) or 0)
        warmup = int(args.get_warmup_steps(max_steps)) if max_steps > 0 and hasattr(args, "get_warmup_steps") else 0
        session.start_identification(state.global_step, max_steps=max_steps, warmup=warmup)
        self._restore(args, state)
        if self.run_name is None:
            self.run_name = (getattr(args, "run_name", None) or os.path.basename(str(args.output_dir)) or "run")[:128]
        self._stop_if_refused(session.register_at_start() if main else None)
        session.share_identification()  # rank 0's step test (or none) on every rank: the replicas step alike
        rollbacks = [g.name for g in (self.policy_doc.guardrails if self.policy_doc else []) if g.action == "rollback"]
        if rollbacks and main:
            own = getattr(self.policy_doc.rewind, "healthy_saves", None)  # REWIND HOOK: the agent saves
            reason = rollback_unsupported(trainer) or (None if _saves_checkpoints(args) or own else (
                "save_strategy='no' saves no checkpoint, so there is none to roll back to; set save_strategy='steps' "
                "and save_steps (a rollback restores the last checkpoint saved while every guardrail held)"))
            if reason:
                log.warning("actuator: guardrail(s) %s may order a rollback, which would halt the run instead: %s",
                            ", ".join(rollbacks), reason)
        if main:
            _warn_if_fewer_processes(args)
        session.start(model, step=state.global_step, max_steps=int(getattr(state, "max_steps", 0) or 0))
        if self._probes_beside_rank0(model):  # rank 0 took its reference and baseline: the same here
            self.suite.setup(model)
            self.suite.run(model, state.global_step, baseline=True)
        self.keeper = CheckpointKeeper.start(self)  # REWIND HOOK: healthy saves, keep-best (after the collectives above)
        return None

    def _probes_beside_rank0(self, model: Any) -> bool:
        """Whether this rank runs the probes' forward passes with rank 0 (sharded, not rank 0)."""
        return self.sharded and not self._is_main and self.suite is not None and model is not None

    def _stop_if_refused(self, failure: ConfigError | None) -> None:
        """Rank 0's refusal stops ``train()`` on every rank, before the first step."""
        error = self._from_rank0(str(failure) if failure else None)
        if error is not None:
            self.session.close_client()
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
            self.suite = ProbeSuite([], budget_share=self.session.reporting.budget_share)
        trainer = self.trainer
        found = missing_probes(doc, {p.name for p in self.suite.probes},
                               tokenizer_of(getattr(trainer, "processing_class", None)),
                               reference=getattr(trainer, "ref_model", None),
                               teacher=getattr(trainer, "teacher_model", None))
        if found.blocking:
            raise ConfigError("; ".join(found.blocking) + ". Pass the probe in probes=[...] (actuator.agents.probes)")
        for message in found.degraded:
            log.warning("actuator: %s", message)
        self.session.unbuilt = {spec.name for spec in doc.probes} - {p.name for p in self.suite.probes} - {
            p.name for p in found.built}
        for probe in found.built:
            self.suite.add(probe)
        if found.built:
            log.info("actuator: probes the policy names, built from shipped data: %s",
                     ", ".join(f"{p.name} ({p.num_examples} examples)" for p in found.built))


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
        self.session.identification_step(state.global_step)
        self._apply_results(args, state, control)
        self.session.after_step(state.global_step, model)
        if self._probes_beside_rank0(model):
            self.suite.run(model, state.global_step)
        self.keeper.step_end(state.global_step)  # REWIND HOOK: save at this reading, prune to K

    def _apply_results(self, args: Any, state: Any, control: Any) -> None:
        """Rank 0's decisions, halt and rollback, applied on every rank at this step boundary."""
        received = self.session.receive()
        payload = self._from_rank0(received)  # every rank applies rank 0's decisions at the same step
        halt = payload.halt
        why = getattr(payload, "why", [])
        if payload.rollback and not halt:
            halt = not self._rollback(args, state, why)
        self.session.apply(payload.decisions, state.global_step)
        saving = _saves_checkpoints(args)  # under save_strategy="no" a halt saves nothing either
        if self.session.run_state != "halted" and self.session.halt_if(halt, state.global_step, why, saving=saving):
            control.should_save = saving
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        session = self.session
        session.keep_metrics(logs)
        if logs is not None and self._is_main:
            session.train_step_logged(state.global_step, logs)  # train.<metric> inputs: every logged step
        if logs is None or not self.setters:
            return
        # Knob values in effect (and decisions applied since the last log) go into the trainer's
        # log, so TensorBoard / W&B show them beside the loss.
        extra = {f"actuator/{name}": value for name, value in session.knob_values().items()}
        extra["actuator/decisions"] = float(session.applied_total)
        # The aggregates of a setter's summary (the per-layer ranks stay in the observations).
        extra.update({f"actuator/{k}": v for k, v in session.setter_summaries().items()
                      if not k.startswith("compression.rank.")})
        extra.update(session.log_extra)
        session.log_extra.clear()
        logs.update(extra)
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(extra)

    def on_evaluate(self, args: Any, state: Any, control: Any, model: Any = None,
                    metrics: dict[str, float] | None = None, **kwargs: Any) -> None:
        self.session.keep_metrics(metrics)
        if self.suite is not None and model is not None and self._is_main:
            self.session.observe(state.global_step, model, evaluate=True)
        elif self._probes_beside_rank0(model):
            self.suite.run(model, state.global_step, evaluate=True)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self.checkpoints.append((state.global_step, path))
        if self.sharded and not self.deepspeed and self.trainer is not None:
            # (DeepSpeed: the Trainer's checkpoint is already the engine's, every rank its partitions.)
            # Every rank writes its shards of the weights and optimizer moments (DCP) beside rank 0's
            # checkpoint: what a rollback restores (torch.distributed.checkpoint; a shared filesystem).
            trainer = self.trainer
            save_sharded(os.path.join(self._from_rank0(path), SHARDED_DIR), trainer.model, trainer.optimizer,
                         trainer.lr_scheduler)
        if self._is_main and self.run_token and os.path.isdir(path):
            # The run token lets a resumed run continue the same run; it is a secret, so it is
            # kept out of trainer_state.json, in its own owner-only file.
            fd = os.open(os.path.join(path, "actuator-token"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(self.run_token)


    # -- checkpointed state (transformers' ExportableState) ----------------------------------
    def state(self) -> dict[str, Any]:
        """Saved by Trainer into each checkpoint's trainer_state.json (JSON).

        ``args`` rebuild an equivalent callback (``ActuatorCallback(**args)``: policy, knob bounds,
        connection without its token, run name and metadata, reporting), which is what
        transformers does on resume when ``restore_callback_states_from_checkpoint=True``; the
        rebuilt one then hands over to the callback configured in the script, with its probes and
        setters (see :meth:`_hand_back`). ``attributes`` are where the run was: its id (the token
        is kept in an owner-only file beside the checkpoint, never in this JSON), sequence number,
        last decision, knob values and the last step at which every guardrail held. Without that
        flag the configured callback restores the same attributes itself (:meth:`_restore`)."""
        session = self.session
        policy = self.policy if isinstance(self.policy, str) else self.policy.model_dump(mode="json")
        reporting = session.reporting
        return {
            "args": _json_safe({
                "policy": policy, "knobs": self.knob_bounds, "connection": session.connection.public(),
                "run": {"name": self.run_name, "metadata": session.metadata},
                "reporting": {"budget_share": reporting.budget_share, "report_every": reporting.report_every},
            }),
            "attributes": {**session.attributes(), "_from_checkpoint": True},
        }

    def _restore(self, args: Any, state: Any) -> None:
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        if not saved or not state.global_step:
            return
        attrs = saved.get("attributes", {})
        token_file = os.path.join(args.output_dir, f"checkpoint-{state.global_step}", "actuator-token")
        token = None
        if attrs.get("run_id") and os.path.exists(token_file):
            with open(token_file) as fh:
                token = fh.read().strip()
        knobs = self.session.restore(attrs, token=token)
        log.info("actuator: resumed at step %d (seq %d, last decision %d, knobs %s)", state.global_step,
                 self.seq, self.last_decision, knobs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.kept = self.keeper.finish(int(state.global_step))  # REWIND HOOK: keep-best at the end
        self.session.finish(step=int(state.global_step))

    def knob_values(self) -> dict[str, float]:
        return self.session.knob_values()

    def _rollback(self, args: Any, state: Any, why: list[str] | tuple[str, ...] = ()) -> bool:
        """Restore the last checkpoint at which every guardrail held; False if there is none.
        ``why``: the service's reasons (the guardrail, its reading and threshold), for the log."""
        because = "; ".join(why) or "a guardrail breach"
        # Rank 0 knows the last healthy step (the service told it); every rank loads what it picks.
        healthy = [(s, p) for s, p in self.checkpoints if self.last_ok_step is not None and s <= self.last_ok_step
                   and os.path.isdir(p)]
        unsupported = None if self.sharded and self.trainer is not None else rollback_unsupported(self.trainer)
        target = self._from_rank0(None if unsupported or not healthy else healthy[-1])
        if target is None:
            log.error("actuator: rollback ordered at step %d (%s) but %s; halting instead", state.global_step, because,
                      unsupported or "no checkpoint was saved while every guardrail held")
            return False
        step, path = target
        trainer = self.trainer
        if self.deepspeed:  # every rank: the engine's checkpoint (its partitions), the HF schedule of that step
            load_deepspeed_checkpoint(trainer, path)
        elif self.sharded:  # each rank its shards of the weights and moments, the schedule of that step
            load_sharded(os.path.join(path, SHARDED_DIR), trainer.model, trainer.optimizer, trainer.lr_scheduler)
        else:
            load_checkpoint(trainer, path)  # weights in place; optimizer moments and schedule of that step
        self.rollbacks.append({"at_step": state.global_step, "to_step": step, "checkpoint": path})
        self.keeper.rewound(state.global_step, step)  # REWIND HOOK: drop the bad stretch's saves
        self.session.log_extra["actuator/rollback_to_step"] = float(step)
        log.warning("actuator: %s: rolled back to %s (step %d) at step %d; training continues", because,
                    path, step, state.global_step)
        return True

    @staticmethod
    def _from_rank0(value: Any) -> Any:
        """``value`` as rank 0 has it, on every rank (itself when not distributed)."""
        return from_rank0(value)


