"""ActuatorCallback: a Hugging Face ``Trainer`` (or a TRL trainer, which subclasses it) under
closed-loop control: a thin adapter from the trainer's events to a :class:`ControlSession`.

    trainer = GRPOTrainer(..., callbacks=[ActuatorCallback("preset:rl-kl")])
    trainer.train()

``Trainer(callbacks=[cb])`` and ``cb.attach(trainer)`` are the same: the callback finds its trainer
at ``on_init_end`` and puts itself before the ``report_to`` loggers.

The run's lifecycle is the session's (agents/session.py), the same sequence a loop of your own
drives: ``cb.session`` is that session, and its state (``run_id``, ``applied``, ``history``, ...)
is read there. Each trainer event is one lifecycle call:

=================  =========================================================================
``on_train_begin``  ``session.begin(model, ..., parts=...)``: the trainer's parts are handed to
                    it (:class:`TrainerParts`): each knob's setter found from the trainer
                    (``knobs.setter_for``: optimizer and scheduler, TRL's ``beta``, distillation
                    and GKD trainers, factorised layers or LoRA, the KL anchor), the probes the
                    policy names built from the trainer's tokenizer and shipped data
                    (``default_probes``), a KL anchor on a pair trainer's pairs, the checkpoint
                    the run resumes from, and how checkpoints are saved and loaded (plain,
                    FSDP2 shards, DeepSpeed's engine)
``on_step_end``     ``session.step(step, model)``: decisions guarded, applied and acknowledged; a
                    rollback rewinds; due probes run; training never waits on the network
``on_log``          ``session.logged(step, logs)``: knob values in effect added to the log line
``on_evaluate``     ``session.evaluated(step, model, metrics)``
``on_save``         ``session.checkpoint_saved(step, path)``
``on_train_end``    ``session.finish(step)``
=================  =========================================================================

What stays here is the Hugging Face side alone: finding the trainer, the place among the loggers,
the checkpoint's JSON (``state``) and the hand-back of ``restore_callback_states_from_checkpoint``.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

from actuator._exceptions import ConfigError
from actuator.policy import PolicyDocument, protect_policy

from ._hf_compat import (find_trainer, fsdp_version, load_checkpoint, load_deepspeed_checkpoint, rollback_unsupported,
                         run_before_loggers, sharding_unsupported)
from .checkpoints import CheckpointKeeper
from .identification import IdentificationMode
from .knobs import KnobSetter, setter_for
from .session import Connection, ControlSession, ProbeSources, Protect, Reporting, RunInfo, TrainerParts
from .sharded import SHARDED_DIR, load_sharded, rank_and_world, save_sharded

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


NO_SAVES = ("save_strategy='no' saves no checkpoint, so there is none to roll back to; set save_strategy='steps' "
            "and save_steps (a rollback restores the last checkpoint saved while every guardrail held)")


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

    The run itself is ``cb.session`` (:class:`ControlSession`): ``cb.session.run_id``,
    ``cb.session.applied``, ``cb.session.history``, ``cb.session.rollbacks``, ...
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
    ) -> None:
        if (policy is None) == (protect is None):
            raise ConfigError("policy: give a policy (name, preset:NAME, document) or protect={...}, not both")
        self._protect = Protect.of(protect) if protect is not None else None
        if self._protect is not None:
            p = self._protect
            policy = protect_policy(dict(p.budgets), on_drift=p.on_drift, on_breach=p.on_breach)
        self.session = ControlSession(policy, setters=setters or [], knobs=knobs or {"learning_rate": {}},
                                      probes=probes, connection=connection, run=run, reporting=reporting,
                                      identify=identify)
        self.trainer: Any = None
        self.keeper = CheckpointKeeper()  # the policy's rewind section (agents/checkpoints.py), from train() start
        self.kept: dict[str, Any] | None = None  # keep-best: the step kept at the end, and why
        self._started = False  # on_train_begin ran
        _LIVE.add(self)

    # Set through transformers' ExportableState restore (``state()["attributes"]``): this instance
    # was rebuilt from a checkpoint and should hand over to the one the user configured.
    _from_checkpoint = False

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
        wanted = "kl_weight" in self.session.policy_knobs() | set(self.session.knob_bounds)
        if (trainer is None or not wanted or "kl_weight" in self.session.extra_setters
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
        session = self.session
        if getattr(self.trainer, "kl_anchor", None) is not None and self._protect is not None and session.run_id is None:
            p = self._protect
            session.policy = session.policy_doc = protect_policy(dict(p.budgets), on_drift=p.on_drift,
                                                                 on_breach=p.on_breach, anchor=True)

    # -- trainer events --------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> Any:
        trainer, predecessor = self._take_trainer()
        if predecessor is not None:
            return self._hand_back(predecessor, trainer, args, state, control, model=model, optimizer=optimizer,
                                   lr_scheduler=lr_scheduler, **kwargs)
        self._started = True
        if trainer is not None and (refused := sharding_unsupported(trainer)):
            raise ConfigError(refused)
        max_steps = int(getattr(state, "max_steps", 0) or 0)
        # rank 0 of the process group (a model fully_shard-ed before a Trainer that sees one process
        # leaves every rank "process zero")
        main = bool(getattr(state, "is_world_process_zero", True)) and rank_and_world()[0] == 0
        self.session.begin(model, step=state.global_step, max_steps=max_steps, warmup=_warmup(args, max_steps),
                           main=main, sharded=_sharded(trainer),
                           parts=self._parts(args, state, model, optimizer, lr_scheduler))
        self.keeper = CheckpointKeeper.start(self)  # healthy saves, keep-best (after begin's collectives)
        return None

    def _take_trainer(self) -> tuple[Any, ActuatorCallback | None]:
        """The trainer, and the configured callback to hand it back to when transformers rebuilt
        this one from a checkpoint (``_predecessor``)."""
        if self.trainer is not None:
            run_before_loggers(self.trainer, self)  # a resume may have re-added us last
            return self.trainer, None
        trainer = find_trainer(self)
        predecessor = self._predecessor(trainer) if trainer is not None and self._from_checkpoint else None
        if trainer is not None and predecessor is None:
            self._bind(trainer, anchor=False)  # the anchor, if any, after the policy is resolved
        return trainer, predecessor

    def _parts(self, args: Any, state: Any, model: Any, optimizer: Any, lr_scheduler: Any) -> TrainerParts:
        """What this trainer hands the session (``TrainerParts``)."""
        trainer = self.trainer
        optimizer = optimizer if optimizer is not None else getattr(trainer, "optimizer", None)
        lr_scheduler = lr_scheduler if lr_scheduler is not None else getattr(trainer, "lr_scheduler", None)
        sharded = _sharded(trainer)
        from .default_probes import tokenizer_of

        return TrainerParts(
            setters=lambda names: {name: setter_for(name, trainer=trainer, optimizer=optimizer,
                                                    lr_scheduler=lr_scheduler, model=model) for name in names},
            policy_resolved=self._protect_with_anchor,
            anchor=lambda: self._anchor_pairs(args, state, model),
            probe_sources=ProbeSources(tokenizer_of(getattr(trainer, "processing_class", None)),
                                       reference=getattr(trainer, "ref_model", None),
                                       teacher=getattr(trainer, "teacher_model", None)),
            resume=self._saved(args, state),
            name=(getattr(args, "run_name", None) or os.path.basename(str(args.output_dir)) or "run")[:128],
            before_start=lambda: _warn_if_fewer_processes(args),
            save=self._save_shards if sharded and not _deepspeed(trainer) else None,
            load=self._load if trainer is not None else None,
            no_rollback=_why_no_rollback(trainer),
            no_saves=None if _saves_checkpoints(args) else NO_SAVES,
            saves_checkpoints=_saves_checkpoints(args))

    def _save_shards(self, path: str) -> None:
        """FSDP2: every rank writes its shards of the weights and optimizer moments (DCP) beside rank
        0's checkpoint, what a rewind restores (torch.distributed.checkpoint; a shared filesystem).
        (DeepSpeed: the Trainer's checkpoint is already the engine's, every rank its partitions.)"""
        trainer = self.trainer
        save_sharded(os.path.join(path, SHARDED_DIR), trainer.model, trainer.optimizer, trainer.lr_scheduler)

    def _load(self, path: str) -> None:
        """A rewind to the checkpoint in ``path``, on every rank."""
        trainer = self.trainer
        if _deepspeed(trainer):  # the engine's checkpoint (its partitions), the HF schedule of that step
            load_deepspeed_checkpoint(trainer, path)
        elif self.session.sharded:  # each rank its shards of the weights and moments, the schedule of that step
            load_sharded(os.path.join(path, SHARDED_DIR), trainer.model, trainer.optimizer, trainer.lr_scheduler)
        else:
            load_checkpoint(trainer, path)  # weights in place; optimizer moments and schedule of that step

    def _saved(self, args: Any, state: Any) -> tuple[dict[str, Any], str] | None:
        """The attributes this callback saved in the checkpoint training resumes from, and its folder."""
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        if not saved or not state.global_step:
            return None
        return saved.get("attributes", {}), os.path.join(args.output_dir, f"checkpoint-{state.global_step}")

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
                 "continues run %s", self.session.run_id)
        return predecessor.on_train_begin(args, state, control, **kwargs)


    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        rewinds = len(self.session.rollbacks)
        halt = self.session.step(state.global_step, model).halt
        for done in self.session.rollbacks[rewinds:]:  # a rewind at this boundary: the bad stretch's saves go
            self.keeper.rewound(done["at_step"], done["to_step"])
        if halt:
            control.should_save = self.session.parts.saves_checkpoints  # under save_strategy="no" nothing
            control.should_training_stop = True
        else:
            self.keeper.step_end(state.global_step)  # a save at this reading if healthy saves are due; prune to K

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        extra = self.session.logged(state.global_step, logs)
        if not extra or logs is None:
            return
        logs.update(extra)
        history = getattr(state, "log_history", None)
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(extra)

    def on_evaluate(self, args: Any, state: Any, control: Any, model: Any = None,
                    metrics: dict[str, float] | None = None, **kwargs: Any) -> None:
        self.session.evaluated(state.global_step, model, metrics)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.checkpoint_saved(state.global_step, os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.kept = self.keeper.finish(int(state.global_step))  # keep-best: load the best, or leave the last
        self.session.finish(step=int(state.global_step))

    # -- checkpointed state (transformers' ExportableState) ----------------------------------
    def state(self) -> dict[str, Any]:
        """Saved by Trainer into each checkpoint's trainer_state.json (JSON).

        ``args`` rebuild an equivalent callback (``ActuatorCallback(**args)``: policy, knob bounds,
        connection without its token, run name and metadata, reporting), which is what
        transformers does on resume when ``restore_callback_states_from_checkpoint=True``; the
        rebuilt one then hands over to the callback configured in the script, with its probes and
        setters (see :meth:`_hand_back`). ``attributes`` are where the run was
        (``ControlSession.attributes``: the token is kept in an owner-only file beside the
        checkpoint, never in this JSON). Without that flag the configured callback resumes from the
        same attributes itself (``ControlSession.resume``)."""
        session = self.session
        policy = session.policy if isinstance(session.policy, str) else session.policy.model_dump(mode="json")
        reporting = session.reporting
        return {
            "args": _json_safe({
                "policy": policy, "knobs": session.knob_bounds, "connection": session.connection.public(),
                "run": {"name": session.run_name, "metadata": session.metadata},
                "reporting": {"budget_share": reporting.budget_share, "report_every": reporting.report_every},
            }),
            "attributes": {**session.attributes(), "_from_checkpoint": True},
        }


def _deepspeed(trainer: Any) -> bool:
    """Whether ``trainer`` trains through DeepSpeed (its checkpoints and rewinds are the engine's)."""
    return bool(getattr(trainer, "is_deepspeed_enabled", False))


def _sharded(trainer: Any) -> bool:
    """Whether ``trainer``'s probes are collectives (FSDP2 or DeepSpeed ZeRO: every rank runs them)."""
    return trainer is not None and (fsdp_version(trainer) == 2 or _deepspeed(trainer))


def _warmup(args: Any, max_steps: int) -> int:
    """The warm-up steps of the trainer's schedule (0 when the run's length is not known)."""
    return int(args.get_warmup_steps(max_steps)) if max_steps > 0 and hasattr(args, "get_warmup_steps") else 0


def _why_no_rollback(trainer: Any) -> str | None:
    """Why this trainer's run cannot be rolled back (None: it can). Sharded, the callback's own
    loaders do it (DCP shards, DeepSpeed's engine). Whether checkpoints are saved at all is
    ``TrainerParts.no_saves`` (the agent's own healthy saves may stand in for them)."""
    return None if _sharded(trainer) else rollback_unsupported(trainer)
