"""What the agent needs from a transformers ``Trainer`` (and a torch scheduler) beyond their
documented API, in one place.

Every use of an undocumented behaviour is here, so that a release that changes one breaks this
module, and ``tests/agents/test_hf_compat.py`` says which. Checked against the sources of
transformers 4.46.0 (the oldest the ``train`` extra allows) and 5.23.0, and run by the tests on the
installed version; torch 2.2 to 2.13.

* **Finding the trainer.** Callbacks are not given the trainer (their events get ``model``,
  ``optimizer``, ``lr_scheduler``, ...). ``Trainer.__init__`` fires ``on_init_end`` and
  ``Trainer.train`` fires ``on_train_begin`` from its own methods, so the trainer is the ``self``
  of a frame on the call stack whose callback handler holds the callback
  (``trainer.py``: ``self.callback_handler.on_init_end(...)`` in ``__init__``, 4.46: l.735,
  5.23: l.642).
* **Callback order.** ``Trainer(callbacks=[...])`` puts user callbacks *after* the ``report_to``
  integrations (``default_callbacks + callbacks``, 4.46: l.628, 5.23: l.595) and every event is
  dispatched in list order with the *same* ``logs`` dict (``CallbackHandler.call_event``), which
  W&B / TensorBoard / MLflow read at once. A callback that adds values to the logs must come
  before them: :func:`run_before_loggers` moves it right after ``DefaultFlowCallback``. Moving a
  callback *earlier* while ``call_event`` iterates the list calls nobody twice and skips nobody.
* **Rollback.** ``Trainer._load_from_checkpoint(path)`` (weights, in place, whatever the model
  kind: sharded, safetensors, PEFT adapters, FSDP, DeepSpeed) and
  ``Trainer._load_optimizer_and_scheduler(path)`` (moments and schedule) are what
  ``train(resume_from_checkpoint=...)`` runs; no public method loads a checkpoint into a live
  trainer. Same signatures in 4.46.0 and 5.23.0. Under DeepSpeed the weights and optimizer state
  are the engine's (:func:`load_deepspeed_checkpoint`).
* **The scheduler's last lr.** After a knob rescales the learning rate, ``get_last_lr()`` (which
  transformers 5 logs as ``learning_rate`` for the next step) must return the new value. torch
  documents ``LRScheduler.state_dict()`` as "an entry for every variable in ``self.__dict__``"
  and ``load_state_dict`` restores them; ``_last_lr`` is the entry ``get_last_lr`` returns.
* **Sharded training.** ``Trainer.is_fsdp_enabled`` / ``is_deepspeed_enabled`` (set in
  ``create_accelerator_and_postprocess``, 4.46 and 5.23) say whether the model is sharded
  (FSDP) or wrapped by DeepSpeed; accelerate's ``state.fsdp_plugin.fsdp_version`` which FSDP.
  :func:`sharding_unsupported` refuses FSDP1 and the DeepSpeed setups not tested here, see its
  docstring; FSDP2 (:func:`fsdp_version`) and DeepSpeed ZeRO-2 / ZeRO-3 run.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["CHECKED_TRANSFORMERS", "find_trainer", "run_before_loggers", "rollback_unsupported",
           "sharding_unsupported", "fsdp_version", "load_checkpoint", "load_deepspeed_checkpoint", "sync_last_lr", "save_checkpoint", "load_weights"]

CHECKED_TRANSFORMERS = ("4.46.0", "5.23.0")

_ROLLBACK_METHODS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler")


def _holds(trainer: Any, callback: Any) -> bool:
    handler = getattr(trainer, "callback_handler", None)
    return any(cb is callback for cb in getattr(handler, "callbacks", ()))


def find_trainer(callback: Any) -> Any | None:
    """The ``Trainer`` whose callback handler holds ``callback``, found on the call stack of a
    trainer event (``on_init_end``, ``on_train_begin``); ``None`` when called from elsewhere."""
    from transformers import Trainer

    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, Trainer) and _holds(owner, callback):
                return owner
            frame = frame.f_back
        return None
    finally:
        del frame  # no reference cycle through the frames


def run_before_loggers(trainer: Any, callback: Any) -> None:
    """Put ``callback`` right after ``DefaultFlowCallback`` (adding it if it is not there), so its
    ``on_log`` runs before every ``report_to`` integration's; never moves it later."""
    from transformers.trainer_callback import DefaultFlowCallback

    callbacks = trainer.callback_handler.callbacks
    flow = [i for i, cb in enumerate(callbacks) if isinstance(cb, DefaultFlowCallback)]
    target = flow[0] + 1 if flow else 0
    where = next((i for i, cb in enumerate(callbacks) if cb is callback), None)
    if where is not None and where <= target:
        return
    if where is not None:
        del callbacks[where]
    callbacks.insert(target, callback)


def rollback_unsupported(trainer: Any) -> str | None:
    """Why ``trainer`` cannot be rolled back to a checkpoint, or ``None`` when it can."""
    if trainer is None:
        return "the callback could not find its trainer (attach it with .attach(trainer))"
    missing = [name for name in _ROLLBACK_METHODS if not callable(getattr(trainer, name, None))]
    if missing:
        import transformers

        return (f"transformers {transformers.__version__} has no Trainer.{', Trainer.'.join(missing)} "
                f"(checked: {', '.join(CHECKED_TRANSFORMERS)})")
    return None


def fsdp_version(trainer: Any) -> int | None:
    """2 when ``trainer`` trains under accelerate's FSDP2 plugin or its model was ``fully_shard``-ed
    before the Trainer (FSDP2 modules), 1 under FSDP1, ``None`` when not sharded by FSDP."""
    from .sharded import is_fully_sharded

    if getattr(trainer, "is_fsdp_enabled", False):
        accelerator = getattr(trainer, "accelerator", None)
        plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
        version = getattr(plugin, "fsdp_version", None) or (2 if getattr(accelerator, "is_fsdp2", False) else 1)
        return int(version)
    model = getattr(trainer, "model", None)
    if model is not None and is_fully_sharded(model):
        return 2
    return None


def sharding_unsupported(trainer: Any) -> str | None:
    """Why the agent refuses this trainer's FSDP1 or DeepSpeed setup, or ``None``.

    FSDP2 (accelerate's plugin with ``fsdp_version: 2``, or a model ``fully_shard``-ed before the
    Trainer) is supported: every rank runs the probes in lockstep (``actuator.agents.sharded``).
    FSDP1 (``FullyShardedDataParallel``) is not: its modules are not checked here (accelerate 1.15
    with ``use_cpu=True`` sets ``DistributedType.FSDP`` only for multi-accelerator types, never
    ``MULTI_CPU``, so accelerate's FSDP path cannot run on this CPU machine, and FSDP1's own
    wrapper was not exercised); a rank-0-only probe would wait forever for the other ranks'
    all-gathers. DeepSpeed ZeRO-2 and ZeRO-3 are supported; what of DeepSpeed was not tested is
    refused by ``sharded.deepspeed_unsupported``, with its reason.
    """
    if getattr(trainer, "is_deepspeed_enabled", False):
        from .sharded import deepspeed_unsupported

        return deepspeed_unsupported(trainer)
    if fsdp_version(trainer) == 1 or _wrapped_by_fsdp1(trainer):
        return ("FSDP1 (FullyShardedDataParallel) is not supported: only FSDP2 is (accelerate's FSDP plugin with "
                "fsdp_version: 2, or torch.distributed.fsdp.fully_shard). Train with FSDP2 or DDP, or without "
                "ActuatorCallback.")
    return None


def _wrapped_by_fsdp1(trainer: Any) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover
        return False
    model = getattr(trainer, "model_wrapped", None) or getattr(trainer, "model", None)
    return any(isinstance(m, FullyShardedDataParallel) for m in getattr(model, "modules", list)())


def load_checkpoint(trainer: Any, path: str) -> None:
    """Load a checkpoint directory into a live trainer: weights in place, optimizer moments and
    the scheduler's state of that step."""
    trainer._load_from_checkpoint(path)
    trainer._load_optimizer_and_scheduler(path)


def save_checkpoint(trainer: Any, path: str) -> None:
    """Write a checkpoint :func:`load_checkpoint` can load into ``path``, outside the Trainer's own
    ``checkpoint-N`` rotation: the weights (``save_model``: config and safetensors, the main
    process writing) and ``Trainer._save_optimizer_and_scheduler(path)`` (moments and schedule,
    what ``_save_checkpoint`` writes; same signature in 4.46.0 and 5.23.0). Every rank calls it."""
    trainer.save_model(path)
    trainer._save_optimizer_and_scheduler(path)


def load_weights(trainer: Any, path: str) -> None:
    """Load only the weights of the checkpoint ``path`` into the live model (keep-best at the end)."""
    trainer._load_from_checkpoint(path)


def load_deepspeed_checkpoint(trainer: Any, path: str) -> None:
    """Load the Trainer's DeepSpeed checkpoint ``path`` (``checkpoint-N``) into the live engine on
    this rank: each rank's weights and optimizer partitions (transformers' ``deepspeed_load_checkpoint``:
    ``engine.load_checkpoint``, what ``train(resume_from_checkpoint=)`` runs), then the HF
    scheduler's state of that step (``_load_optimizer_and_scheduler`` loads only that under
    DeepSpeed). Every rank calls it."""
    from transformers.integrations.deepspeed import deepspeed_load_checkpoint

    deepspeed_load_checkpoint(trainer.model_wrapped, path, load_module_strict=True)
    trainer._load_optimizer_and_scheduler(path)


def sync_last_lr(scheduler: Any, optimizer: Any) -> None:
    """Make ``scheduler.get_last_lr()`` return the param groups' current learning rates."""
    state = scheduler.state_dict()
    if "_last_lr" not in state:  # a scheduler that keeps no last lr: nothing can be stale
        return
    state["_last_lr"] = [group["lr"] for group in optimizer.param_groups]
    scheduler.load_state_dict(state)
