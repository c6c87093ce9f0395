"""The agent's own checkpoints for rewinds (a policy's ``rewind`` section): saves at healthy probe
readings, kept to the newest K; the best model by a probe, loaded at the end of training.

A rollback restores the newest checkpoint saved while every guardrail held. With only the user's
``save_steps`` that point may be far back; with ``rewind.healthy_saves`` the agent saves at its
probe readings (at most one per ``every`` steps) into ``<output_dir>/actuator-rewind/checkpoint-N``,
a folder of its own: the Trainer's ``save_total_limit`` never counts these, and the agent never
deletes a checkpoint it did not write. A save is *pending* until the service answers that every
guardrail held at its step or later (the session's ``last_ok_step``); the newest ``keep`` confirmed
saves are kept, older ones deleted; a rewind deletes the saves newer than the checkpoint it went
back to (they are from the bad stretch).

``rewind.keep_best`` names a probe and a direction: a reading better than every earlier one is
saved (or its healthy save is marked), the previous best deleted unless another rule keeps it. At
the end of training the best checkpoint's weights are loaded (``at_end: load``) or the last step's
stay (``last``). What was kept, why, and what each save cost travel in the next observation's
metrics (``checkpoint.*``, ``keep_best.*``), the trainer's log (``actuator/checkpoint_save_seconds``)
and the agent's log.

The data after a rewind: the Trainer's batch iterator lives inside its training loop and keeps
going, so the batches consumed since the rewound checkpoint are not seen again (``data: skip``, the
one choice; ``replay`` is refused by the policy with the reason).

Sharded runs (FSDP2): every rank writes its shards (``torch.distributed.checkpoint``) where rank 0
says, and loads them at a rewind and at the end; rank 0 decides and deletes. DeepSpeed: not
supported here (its rollbacks use the Trainer's checkpoints), said once at ``train()`` start.

The API the callback (or a session) calls, one line each: :meth:`CheckpointKeeper.start` at train
start, :meth:`~CheckpointKeeper.step_end` after the step's probes, :meth:`~CheckpointKeeper.rewound`
after a rollback, :meth:`~CheckpointKeeper.finish` before the run is closed.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from actuator.policy import RewindSpec

from ._hf_compat import load_weights, save_checkpoint
from .sharded import SHARDED_DIR, from_rank0, load_sharded, save_sharded

__all__ = ["CheckpointKeeper", "OWN_DIR"]

log = logging.getLogger("actuator.agents")

OWN_DIR = "actuator-rewind"  # under the trainer's output_dir: the agent's checkpoints, and only those


@dataclass
class Save:
    """One of the agent's checkpoints: its step, folder, the keep-best probe's reading there, why
    it was made (``healthy``: a healthy save; else only as the best reading), and whether the
    service has confirmed every guardrail held there."""

    step: int
    path: str
    value: float | None
    healthy: bool
    confirmed: bool = False


def _deepspeed(trainer: Any) -> bool:
    """Whether ``trainer`` trains through DeepSpeed (its checkpoints are the engine's)."""
    return bool(getattr(trainer, "is_deepspeed_enabled", False))


class CheckpointKeeper:
    """Healthy saves, pruning to K, keep-best tracking and the load at the end, for one run.

    ``owner`` is the callback (duck-typed: ``trainer``, ``session``, ``checkpoints``, ``sharded``,
    ``deepspeed``): its ``checkpoints`` list is where rollbacks look for their target, so the saves
    kept here are entered in it (and taken out when deleted)."""

    def __init__(self, spec: Any = None, owner: Any = None) -> None:
        self.spec = spec
        self.owner = owner
        self.saves: list[Save] = []
        self.best: Save | None = None
        self.seconds_total = 0.0
        self.made = 0  # saves made (kept or deleted since)
        self.rewinds = 0  # rollbacks this run
        self.last_healthy_step: int | None = None

    @property
    def active(self) -> bool:
        return self.spec is not None and (self.spec.healthy_saves is not None or self.spec.keep_best is not None)

    @classmethod
    def start(cls, owner: Any) -> CheckpointKeeper:
        """The keeper of ``owner``'s run, from its policy's ``rewind`` section (inactive without one)."""
        # Rank 0's section on every rank (under DDP only rank 0 may have resolved the policy): the
        # ranks must agree on whether to save, since a save's order is a collective.
        spec = getattr(owner.session.policy_doc, "rewind", None)
        shared = from_rank0(None if spec is None else spec.model_dump(mode="json"))  # plain data over the wire
        spec = None if shared is None else RewindSpec.model_validate(shared)
        keeper = cls(spec, owner)
        if keeper.active and (_deepspeed(owner.trainer) or owner.trainer is None):
            why = "under DeepSpeed" if _deepspeed(owner.trainer) else "without the trainer (attach the callback)"
            if owner.session.main:
                log.warning("actuator: the policy's rewind.healthy_saves / rewind.keep_best are not supported %s: "
                            "no checkpoints of the agent's own are saved; rollbacks use the Trainer's checkpoints", why)
            keeper.spec = None
        if keeper.active and owner.session.main:
            parts = []
            if spec.healthy_saves is not None:
                parts.append(f"saves at healthy probe readings (every {spec.healthy_saves.every} step(s) at most, "
                             f"the newest {spec.healthy_saves.keep} kept)")
            if spec.keep_best is not None:
                kb = spec.keep_best
                parts.append(f"the best {kb.probe} ({kb.mode}) kept, {'loaded' if kb.at_end == 'load' else 'on disk'} "
                             "at the end")
            log.info("actuator: rewind: %s, in %s", "; ".join(parts), keeper.root)
        return keeper

    @property
    def root(self) -> str:
        return os.path.join(str(self.owner.trainer.args.output_dir), OWN_DIR)

    # -- during training -------------------------------------------------------------------------
    def step_end(self, step: int) -> None:
        """After the step's probes: confirm and prune (rank 0), then save if this reading calls
        for it (every rank, where rank 0 says)."""
        if not self.active:
            return
        order = None
        if self.owner.session.main:
            self._confirm()
            order = self._due(step)
        order = from_rank0(order)
        if order is not None:
            self._save(step, order)

    def _due(self, step: int) -> dict[str, Any] | None:
        """What this step's reading calls for (rank 0): a healthy save, a new best, or nothing."""
        session = self.owner.session
        last = session.history[-1] if session.history else None
        if session.run_state == "halted" or last is None or last["step"] != step or not last["probes"]:
            return None  # no probe reading at this step
        spec = self.spec
        hs = spec.healthy_saves
        # One save awaits the service's word at a time: during a breach no reading is healthy, and
        # the disk holds at most K confirmed saves, one pending and the best.
        pending = any(s.healthy and not s.confirmed for s in self.saves)
        healthy = hs is not None and not pending and (
            self.last_healthy_step is None or step - self.last_healthy_step >= hs.every)
        value = None
        best = False
        if spec.keep_best is not None:
            value = last["probes"].get(spec.keep_best.probe)
            best = value is not None and math.isfinite(value) and (
                self.best is None or self.best.value is None
                or (value > self.best.value if spec.keep_best.mode == "max" else value < self.best.value))
        if not healthy and not best:
            return None
        return {"path": os.path.join(self.root, f"checkpoint-{step}"), "healthy": healthy, "best": best,
                "value": value}

    def _save(self, step: int, order: dict[str, Any]) -> None:
        owner = self.owner
        trainer = owner.trainer
        path = order["path"]
        began = time.perf_counter()
        try:
            if owner.session.sharded:  # every rank its shards of the weights and moments, the schedule of this step
                save_sharded(os.path.join(path, SHARDED_DIR), trainer.model, trainer.optimizer, trainer.lr_scheduler)
            else:
                save_checkpoint(trainer, path)
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop training
            log.warning("actuator: rewind: the save at step %d to %s failed, training goes on without it: %s",
                        step, path, exc)
            return
        seconds = time.perf_counter() - began
        if not owner.session.main:
            return
        save = Save(step, path, order["value"], order["healthy"])
        self.saves.append(save)
        owner.session.checkpoints.append((step, path))
        owner.session.checkpoints.sort(key=lambda c: c[0])
        if save.healthy:
            self.last_healthy_step = step
        previous = self.best
        if order["best"]:
            self.best = save
        self.seconds_total += seconds
        self.made += 1
        self._report(seconds)
        whys = ["a probe reading, healthy once the service says every guardrail held"] if save.healthy else []
        if order["best"]:
            whys.append(f"the best {self.spec.keep_best.probe} so far ({order['value']:.6g})")
        why = " and ".join(whys)
        log.info("actuator: rewind: saved %s at step %d in %.3f s (%s; %d save(s) made, %.3f s in all)", path, step,
                 seconds, why, self.made, self.seconds_total)
        if previous is not None and previous is not self.best:
            self._prune()

    def _report(self, seconds: float) -> None:
        """The save's cost, like the probes' time: in the next observation and the trainer's log."""
        session = self.owner.session
        session.metrics["checkpoint.save_seconds"] = seconds
        session.metrics["checkpoint.save_seconds_total"] = self.seconds_total
        session.metrics["checkpoint.saves"] = float(self.made)
        session.metrics["checkpoint.kept"] = float(len(self.saves))
        session.log_extra["actuator/checkpoint_save_seconds"] = seconds
        if self.best is not None:
            session.metrics["keep_best.step"] = float(self.best.step)
            if self.best.value is not None:
                session.metrics["keep_best.value"] = float(self.best.value)

    def _confirm(self) -> None:
        """Saves at or before the last step the service said every guardrail held are healthy."""
        ok = self.owner.session.last_ok_step
        if ok is None:
            return
        changed = False
        for save in self.saves:
            if not save.confirmed and save.step <= ok:
                save.confirmed = changed = True
        if changed:
            self._prune()

    def _prune(self) -> None:
        """Keep the newest K confirmed healthy saves, every pending one and the best; delete the rest."""
        hs = self.spec.healthy_saves
        confirmed = [s for s in self.saves if s.healthy and s.confirmed]
        kept = {id(s) for s in confirmed[-hs.keep:]} if hs is not None else set()
        kept |= {id(s) for s in self.saves if not s.confirmed and s.healthy}
        if self.best is not None:
            kept.add(id(self.best))
        self._delete([s for s in self.saves if id(s) not in kept], "pruned")

    def _delete(self, gone: list[Save], why: str) -> None:
        for save in gone:
            self.saves.remove(save)
            if (save.step, save.path) in self.owner.session.checkpoints:
                self.owner.session.checkpoints.remove((save.step, save.path))
            shutil.rmtree(save.path, ignore_errors=True)
        if gone:
            log.info("actuator: rewind: %s %s; kept: %s", why, ", ".join(f"checkpoint-{s.step}" for s in gone),
                     ", ".join(f"checkpoint-{s.step}" for s in self.saves) or "none")

    def rewound(self, at_step: int, to_step: int) -> None:
        """After a rollback from ``at_step`` to ``to_step``: the saves newer than ``to_step`` are from
        the bad stretch (deleted; the best among the rest is the best again). The batches of steps
        ``to_step + 1`` .. ``at_step`` are not seen again (``data: skip``)."""
        if self.owner is None or not self.owner.session.main:
            return
        self.rewinds += 1
        # The checkpoint used, in the run's record (the service knows the last healthy step, not the file).
        self.owner.session.metrics.update({"rewind.at_step": float(at_step), "rewind.to_step": float(to_step),
                                           "rewind.count": float(self.rewinds)})
        log.warning("actuator: rewind: data: skip: the batches of steps %d-%d are not seen again; training goes on "
                    "with the next batch", to_step + 1, at_step)
        if not self.active:  # a rollback to the Trainer's checkpoints: nothing of the agent's to drop
            return
        self._delete([s for s in self.saves if s.step > to_step], "deleted (after the rewound checkpoint)")
        if self.best is not None and self.best not in self.saves:
            scored = [s for s in self.saves if s.value is not None]
            pick = max if self.spec.keep_best.mode == "max" else min
            self.best = pick(scored, key=lambda s: s.value) if scored else None
        self.last_healthy_step = to_step

    # -- the end --------------------------------------------------------------------------------
    def finish(self, step: int) -> dict[str, Any] | None:
        """At the end of training: load the best reading's weights (``at_end: load``) or leave the
        last step's; say which step is kept and why (the log, and the metrics of a last observation).
        Every rank calls it. Returns what was kept (rank 0), for reports."""
        kb = self.spec.keep_best if self.active else None
        if kb is None:
            return None
        best = self.best
        chosen = from_rank0(None if best is None else (best.step, best.path, best.value))
        if chosen is None:
            if self.owner.session.main:
                log.warning("actuator: keep-best: no reading of %s was taken: the last step's model stays", kb.probe)
            return None
        best_step, path, value = chosen
        load = kb.at_end == "load" and best_step != step
        if load:
            trainer = self.owner.trainer
            if self.owner.session.sharded:
                load_sharded(os.path.join(path, SHARDED_DIR), trainer.model, trainer.optimizer, trainer.lr_scheduler)
            else:
                load_weights(trainer, path)
        if not self.owner.session.main:
            return None
        kept = {"step": best_step, "value": value, "checkpoint": path, "loaded": load, "probe": kb.probe,
                "mode": kb.mode}
        why = (f"{kb.probe} {value:.6g} at step {best_step} is the {'highest' if kb.mode == 'max' else 'lowest'} "
               "reading")
        if load:
            log.warning("actuator: keep-best: loaded %s (%s); the model is step %d's, not the last step's (%d)",
                        path, why, best_step, step)
        else:
            log.info("actuator: keep-best: %s; %s", why, "the last step's model stays (at_end: last), the best is "
                     f"kept at {path}" if best_step != step else "it is the last step's")
        session = self.owner.session
        session.metrics.update({"keep_best.step": float(best_step), "keep_best.value": float(value),
                                "keep_best.loaded": 1.0 if load else 0.0})
        session.submit(step, {})  # the run's record says which step is kept
        return kept
