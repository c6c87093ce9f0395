"""Rank knobs: factorised layers (``RankKnob``), PEFT LoRA (``LoraRankKnob``), AdaLoRA budget.

All three are named ``"rank"`` (integer scale) and read their value back from what the forward
pass uses: the layers' active rank, the LoRA masks, the AdaLoRA rank allocator's budget.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..knobs import KnobNotSupported, knob_setter
from ._lowrank import LowRankLinear, lowrank_layers

__all__ = ["RankKnob", "LoraRankKnob", "AdaLoraBudgetKnob"]


def _as_int_rank(value: float, low: int, high: int, what: str) -> int:
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{what}: rank must be finite, got {value}")
    rank = int(round(value))
    if not low <= rank <= high:
        raise ValueError(f"{what}: rank {value} outside [{low}, {high}]")
    return rank


class RankKnob:
    """Active rank of every :class:`LowRankLinear` in a model (integer scale).

    Value semantics for heterogeneous layers: ``apply(k)`` sets each layer to ``min(k, its max
    rank)`` (one common absolute rank, clipped per layer); ``read()`` returns the largest active
    rank over the layers, which is ``k`` after an ``apply(k)``. Non-integers are rounded; values
    outside ``bounds`` = [1, largest max rank] raise ``ValueError``. The change is a Python int
    per layer, effective from the next forward; the optimizer is not rebuilt.
    """

    name = "rank"

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._layers: list[LowRankLinear] = list(lowrank_layers(model).values())
        if not self._layers:
            raise KnobNotSupported(
                "RankKnob: the model has no LowRankLinear layers; call "
                "actuator.agents.compression.factorize(model, ...) before building the optimizer"
            )

    @property
    def bounds(self) -> tuple[int, int]:
        return 1, max(layer.max_rank for layer in self._layers)

    def read(self) -> float:
        return float(max(layer.active_rank for layer in self._layers))

    def apply(self, value: float) -> float:
        rank = _as_int_rank(value, *self.bounds, what=self.name)
        for layer in self._layers:
            layer.active_rank = min(rank, layer.max_rank)
        return self.read()


def _peft_lora_layer_types() -> tuple[type, type | None]:
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError as exc:  # pragma: no cover - depends on install
        raise ImportError("LoRA rank knobs need peft: `pip install 'actuator[train]'`") from exc
    try:
        from peft.tuners.adalora import AdaLoraLayer
    except ImportError:  # pragma: no cover
        AdaLoraLayer = None  # noqa: N806
    return LoraLayer, AdaLoraLayer


class _LoraMask:
    """Forward hook on ``lora_A[adapter]`` zeroing its output channels ≥ k.

    PEFT computes ``lora_B(lora_A(dropout(x))) * scaling``; zeroing channel j of lora_A's output
    removes rank-one component ``B[:, j] A[j, :]`` from the update, and both ``A[j, :]`` and
    ``B[:, j]`` get exactly zero gradient. The multiply is over r channels only (r ≪ in), and is
    skipped entirely at full rank.
    """

    def __init__(self, layer: nn.Module, adapter: str) -> None:
        self.layer = layer
        self.adapter = adapter
        lora_a = layer.lora_A[adapter]
        self.max_rank = int(layer.r[adapter])
        self.mask = torch.ones(self.max_rank, device=lora_a.weight.device, dtype=lora_a.weight.dtype)
        self._full = True  # plain bool so the hook never syncs with the device
        self.handle = lora_a.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor | None:
        if self._full:
            return None
        if self.mask.device != output.device or self.mask.dtype != output.dtype:
            self.mask = self.mask.to(device=output.device, dtype=output.dtype)
        return output * self.mask

    @property
    def rank(self) -> int:
        # Read back from the mask the hook multiplies with, not from a separate counter.
        return int(self.mask.count_nonzero().item())

    def set_rank(self, k: int) -> None:
        k = min(k, self.max_rank)
        self.mask.zero_()
        self.mask[:k] = 1
        self._full = k >= self.max_rank


class LoraRankKnob:
    """Effective rank of PEFT LoRA adapters, by masking components beyond the active rank.

    The ``r`` given at creation is the max rank. ``apply(k)`` keeps components ``0..k-1`` of each
    adapted layer (``min(k, r)`` per layer for ``rank_pattern`` models): the update becomes
    ``scaling · B[:, :k] · A[:k, :]``. ``scaling`` (``alpha/r`` or ``alpha/√r`` for rsLoRA) is
    left unchanged, so a mask is a pure truncation and growing back restores the same update.
    Masked rows of ``A`` and columns of ``B`` get zero gradient and stay in the optimizer
    (same caveats on Adam momentum / weight decay as :class:`LowRankLinear`).

    Unlike an SVD factorisation, LoRA components are not ordered by importance: truncating keeps
    the first k. Use it on adapters trained under the knob from the start (the controller then
    shapes which components carry the update), or call :meth:`bake` before ``merge_and_unload``
    / ``save_pretrained``: those read ``lora_A``/``lora_B`` directly and would otherwise include
    the masked components. The mask is not saved in the adapter; the callback's state carries
    the knob value.

    Refuses (``KnobNotSupported``) AdaLoRA layers (use :class:`AdaLoraBudgetKnob`), LoRA variants
    (DoRA and others compute norms from the full ``B @ A``), merged adapters and models without
    LoRA Linear layers.
    """

    name = "rank"

    def __init__(self, peft_model: nn.Module, adapter_name: str | None = None) -> None:
        LoraLayer, AdaLoraLayer = _peft_lora_layer_types()  # noqa: N806
        adapter = adapter_name or getattr(peft_model, "active_adapter", None) or "default"
        if isinstance(adapter, (list, tuple)):
            adapter = adapter[0]
        self.adapter = adapter
        self._masks: list[_LoraMask] = []
        for name, module in peft_model.named_modules():
            if AdaLoraLayer is not None and isinstance(module, AdaLoraLayer):
                raise KnobNotSupported(
                    f"LoraRankKnob: {name} is an AdaLoRA layer; steer AdaLoRA with AdaLoraBudgetKnob"
                )
            if not isinstance(module, LoraLayer) or adapter not in getattr(module, "lora_A", {}):
                continue
            if not isinstance(module.lora_A[adapter], nn.Linear):
                raise KnobNotSupported(
                    f"LoraRankKnob: {name} ({type(module).__name__}) has a non-Linear lora_A; only "
                    "LoRA on Linear / Conv1D layers is supported"
                )
            if adapter in getattr(module, "lora_variant", {}):
                variant = type(module.lora_variant[adapter]).__name__
                raise KnobNotSupported(
                    f"LoraRankKnob: {name} uses the LoRA variant {variant}, which reads the full B@A "
                    "outside lora_A's forward; masking would be inconsistent"
                )
            if getattr(module, "merged", False):
                raise KnobNotSupported(f"LoraRankKnob: {name} has merged adapters; unmerge first")
            self._masks.append(_LoraMask(module, adapter))
        if not self._masks:
            self.remove()
            raise KnobNotSupported(f"LoraRankKnob: no LoRA Linear layers for adapter {adapter!r}")

    @property
    def bounds(self) -> tuple[int, int]:
        return 1, max(m.max_rank for m in self._masks)

    def read(self) -> float:
        return float(max(m.rank for m in self._masks))

    def apply(self, value: float) -> float:
        rank = _as_int_rank(value, *self.bounds, what=self.name)
        for m in self._masks:
            m.set_rank(rank)
        return self.read()

    @torch.no_grad()
    def bake(self) -> None:
        """Zero the masked rows of ``lora_A`` and columns of ``lora_B`` in place (irreversible).

        Afterwards ``merge_and_unload`` / ``save_pretrained`` reproduce the masked forward.
        """
        for m in self._masks:
            k = m.rank
            m.layer.lora_A[m.adapter].weight[k:].zero_()
            m.layer.lora_B[m.adapter].weight[:, k:].zero_()

    def remove(self) -> None:
        """Detach the hooks: the adapters run at full rank again."""
        for m in self._masks:
            m.handle.remove()
        self._masks = []


class AdaLoraBudgetKnob:
    """Target average rank of an AdaLoRA adapter (its final rank budget), integer scale.

    How AdaLoRA allocates rank (peft 0.21.2, ``tuners/adalora``): the user's loop calls
    ``model.base_model.update_and_allocate(global_step)`` after each optimizer step (HF Trainer
    does not; a callback must). Between ``tinit`` and ``total_step - tfinal`` the allocator's
    ``budget_schedule`` moves the total budget from ``init_bgt`` (init_r per matrix) towards
    ``rankallocator.target_bgt`` (target_r × number of matrices) on a cubic schedule and, every
    ``deltaT`` steps, zeroes the least important singular values ``lora_E`` down to that budget.
    ``target_bgt`` is read at every call, so this knob sets it: the budget follows from the next
    allocation on. It does not touch ``init_bgt`` nor the schedule's shape.

    Shrinking takes effect at the next allocation. Growing lets pruned triplets compete again,
    but they restart from ``lora_E = 0`` and must earn importance through their gradients: growth
    is soft. From ``total_step - tfinal`` on AdaLoRA freezes its ``rank_pattern`` and only
    re-applies it: pass ``trainer`` (anything with ``state.global_step``) and ``apply`` refuses
    there with ``KnobNotSupported``; without it the knob cannot tell and a late write has no
    effect. Bounds: [1, init_r - 1] (a budget equal to ``init_bgt`` makes AdaLoRA's
    ``kthvalue(k=0)`` fail).
    """

    name = "rank"

    def __init__(self, peft_model: nn.Module, trainer: Any | None = None) -> None:
        try:
            from peft.tuners.adalora import AdaLoraModel
        except ImportError as exc:  # pragma: no cover
            raise ImportError("AdaLoraBudgetKnob needs peft: `pip install 'actuator[train]'`") from exc
        tuner = getattr(peft_model, "base_model", peft_model)
        if not isinstance(tuner, AdaLoraModel):
            raise KnobNotSupported("AdaLoraBudgetKnob: the model is not a PEFT AdaLoRA model")
        allocator = getattr(tuner, "rankallocator", None)
        if allocator is None:
            raise KnobNotSupported("AdaLoraBudgetKnob: the AdaLoRA adapter is in inference mode (no rank allocator)")
        self.tuner = tuner
        self.allocator = allocator
        self.trainer = trainer
        self.config = allocator.peft_config
        self.n_matrices = len(allocator.name_set)

    @property
    def bounds(self) -> tuple[int, int]:
        return 1, max(1, self.allocator.init_bgt // self.n_matrices - 1)

    def read(self) -> float:
        return self.allocator.target_bgt / self.n_matrices

    def apply(self, value: float) -> float:
        if self.trainer is not None:
            step = int(self.trainer.state.global_step)
            final = self.config.total_step - self.config.tfinal
            if step >= final:
                raise KnobNotSupported(
                    f"AdaLoraBudgetKnob: step {step} is in AdaLoRA's final phase (from step {final}); "
                    "its rank_pattern is frozen and only re-applied"
                )
        rank = _as_int_rank(value, *self.bounds, what=self.name)
        self.allocator.target_bgt = rank * self.n_matrices
        self.config.target_r = rank  # so the saved adapter config tells the truth
        return self.read()


@knob_setter("rank", hint="actuator.agents.compression.RankKnob(model)")
def _rank(*, trainer: Any, model: Any, **_: Any) -> RankKnob | LoraRankKnob:
    """``rank``: the factorised layers' active rank (``factorize``), else PEFT LoRA masks."""
    from ..probes._common import is_peft_model

    model = model if model is not None else getattr(trainer, "model", None)
    if model is not None and lowrank_layers(model):
        return RankKnob(model)
    if model is not None and is_peft_model(model):
        return LoraRankKnob(model)
    raise KnobNotSupported(
        "the model has no LowRankLinear layers and is not a PEFT LoRA model; call "
        "actuator.agents.compression.factorize(model, ...) before building the trainer (or pass "
        "setters=[actuator.agents.compression.LoraRankKnob(peft_model)] / AdaLoraBudgetKnob for adapters)")
