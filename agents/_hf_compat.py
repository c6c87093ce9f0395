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
  trainer. Same signatures in 4.46.0 and 5.23.0.
* **The scheduler's last lr.** After a knob rescales the learning rate, ``get_last_lr()`` (which
  transformers 5 logs as ``learning_rate`` for the next step) must return the new value. torch
  documents ``LRScheduler.state_dict()`` as "an entry for every variable in ``self.__dict__``"
  and ``load_state_dict`` restores them; ``_last_lr`` is the entry ``get_last_lr`` returns.
* **Sharded training.** ``Trainer.is_fsdp_enabled`` / ``is_deepspeed_enabled`` (set in
  ``create_accelerator_and_postprocess``, 4.46 and 5.23) say whether the model is sharded
  (FSDP) or wrapped by DeepSpeed. :func:`sharding_unsupported` refuses both, see its docstring.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["CHECKED_TRANSFORMERS", "find_trainer", "run_before_loggers", "rollback_unsupported",
           "sharding_unsupported", "load_checkpoint", "sync_last_lr"]

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


def sharding_unsupported(trainer: Any) -> str | None:
    """Why the agent refuses this trainer's FSDP or DeepSpeed setup, or ``None``.

    Only rank 0 probes, and a probe runs forward passes (and, for drift, keeps a frozen copy) on
    rank 0 alone. Under FSDP (1 or 2) and DeepSpeed ZeRO-3 a forward pass all-gathers the
    parameters with every rank taking part, so a rank-0-only probe would hang the run, and a copy
    of a sharded module holds one shard. Probing on gathered weights would need every rank in the
    probe; that is not built, and it cannot be tested here: with ``use_cpu=True`` accelerate
    1.15 sets ``DistributedType.FSDP`` only for multi-accelerator types, never ``MULTI_CPU``
    (``accelerate/state.py``): FSDP1's plugin raises "no available devices" with the default
    ``sync_module_states=True``, and with it off, or ``fsdp_version=2``, the run silently trains
    as plain DDP over gloo (checked on 2 processes). DeepSpeed ZeRO-1/2 keep full weights
    on every rank but wrap the optimizer and scheduler the knobs write to; that is not verified
    either. Refused with this reason rather than left to hang or to steer nothing.
    """
    for flag, what in (("is_fsdp_enabled", "FSDP"), ("is_deepspeed_enabled", "DeepSpeed")):
        if getattr(trainer, flag, False):
            return (f"{what} is not supported: only rank 0 probes, and a rank-0-only forward pass through a model "
                    f"sharded by {what} waits for the other ranks' all-gathers forever. Train with DDP "
                    "(the default for several processes), or without ActuatorCallback.")
    return None


def load_checkpoint(trainer: Any, path: str) -> None:
    """Load a checkpoint directory into a live trainer: weights in place, optimizer moments and
    the scheduler's state of that step."""
    trainer._load_from_checkpoint(path)
    trainer._load_optimizer_and_scheduler(path)


def sync_last_lr(scheduler: Any, optimizer: Any) -> None:
    """Make ``scheduler.get_last_lr()`` return the param groups' current learning rates."""
    state = scheduler.state_dict()
    if "_last_lr" not in state:  # a scheduler that keeps no last lr: nothing can be stale
        return
    state["_last_lr"] = [group["lr"] for group in optimizer.param_groups]
    scheduler.load_state_dict(state)
