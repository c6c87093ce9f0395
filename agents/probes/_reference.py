"""The frozen reference a drift probe compares the current model to."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ._common import is_peft_model
from ._errors import ProbeSetupError

__all__ = ["ReferenceModel", "snapshot"]


def snapshot(model: Any) -> Any:
    """A frozen deep copy of ``model`` (same device), in eval mode, without gradients; of a model
    sharded by FSDP2 or partitioned by DeepSpeed ZeRO-3, a copy sharded the same way (each rank
    holds its shard; a collective every rank calls)."""
    from ..sharded import deepspeed_copy, is_fully_sharded, is_zero3, sharded_copy

    if is_fully_sharded(model):
        return sharded_copy(model)
    if is_zero3(model):
        return deepspeed_copy(model)
    reference = copy.deepcopy(model)
    # TRL trainers (SFT, DPO, GRPO, RLOO, KTO) patch an instance-level ``model.forward`` whose
    # closure holds the *live* model's bound forward; deepcopy keeps that closure, so the copy
    # would run the model under training and drift would read 0 forever. Drop the instance
    # attribute so the copy runs its own class forward (accelerate's hooks are left alone).
    if "forward" in vars(reference) and not hasattr(reference, "_hf_hook"):
        del reference.forward
    for parameter in reference.parameters():
        parameter.requires_grad_(False)
        parameter.grad = None
    reference.eval()
    return reference


class ReferenceModel:
    """Where a drift probe gets its reference from, in order of preference.

    1. A model the user gave (``reference=``): used as is, assumed frozen.
    2. A PEFT model under training: the same model inside ``disable_adapter()`` is the base
       model, so no second copy is held in memory.
    3. Otherwise a deep copy of the weights taken at ``setup`` (train begin). Probes in one
       ``ProbeSuite`` share that copy (``share``), so KL and embedding drift together cost one
       copy, not two.
    """

    def __init__(self, reference: Any = None) -> None:
        self.given = reference
        self.snapshot: Any = None
        self._shared: dict[int, Any] | None = None

    def share(self, snapshots: dict[int, Any]) -> None:
        """Take (or leave) the snapshot in ``snapshots`` at the next ``setup``."""
        self._shared = snapshots

    def setup(self, model: Any) -> None:
        shared, self._shared = self._shared, None
        if self.given is not None or is_peft_model(model):
            return
        if shared is not None and id(model) in shared:
            self.snapshot = shared[id(model)]
            return
        self.snapshot = snapshot(model)
        if shared is not None:
            shared[id(model)] = self.snapshot

    def modules(self) -> tuple[Any, ...]:
        return tuple(m for m in (self.given, self.snapshot) if m is not None)

    @contextmanager
    def view(self, model: Any) -> Iterator[Any]:
        """Yield the module to run as the reference for the current ``model``."""
        if self.given is not None:
            yield self.given
        elif self.snapshot is not None:
            yield self.snapshot
        elif is_peft_model(model):
            with model.disable_adapter():
                yield model
        else:
            raise ProbeSetupError(
                "no reference model: call setup(model) at train begin (it snapshots the starting "
                "weights), pass reference=, or train a PEFT model (the base is the reference)"
            )
