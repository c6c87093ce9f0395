"""``mlp_channel_threshold``: structured width pruning of MLP channels under one global threshold.

A gated MLP (Llama, Mistral, Qwen, SmolLM: ``down(act(gate(x)) * up(x))``) has ``intermediate``
channels; channel j owns row j of ``gate_proj`` and ``up_proj`` and column j of ``down_proj``,
``2·hidden + hidden`` parameters. Removing it removes exactly its contribution
``W_down[:, j]·h_j`` from the output, so a channel's importance is the size of that contribution
on calibration data: ``‖h_j‖₂ · ‖W_down[:, j]‖₂`` (Wanda's weight-times-activation score, per
output channel as in FLAP / Minitron's activation-based width importance). One global ``τ`` on
that score, across all layers, keeps channel j of layer l where its score is at least ``τ``:
layers whose channels matter less end narrower.

Why this knob next to ``compression_threshold``: a low-rank factor pair saves parameters only
below the break-even rank (419 of 576 for SmolLM2's 576×1536 projections), and SmolLM2's
whitened spectra are flat, so the first 1% of parameters a factorisation saves already costs
+18% perplexity (compress-rank benchmark). A pruned channel saves its parameters from the first
one: offline, the same model keeps +7% perplexity at 97% of its parameters by channels against
+136% by ranks.

Masking, not slicing, while training: a forward pre-hook multiplies ``down_proj``'s input by a
0/1 mask, so masked channels contribute nothing and their gate/up rows and down column get an
exactly zero gradient; no parameter is created or dropped, the optimizer is not rebuilt, and
growing back (lowering ``τ``) unmasks the kept values. :func:`~actuator.agents.compression.
export_pretrained` slices them out for good.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..knobs import KnobNotSupported
from ._lowrank import _calibrate
from ._threshold import LogThresholdKnob, register_calibrated, short_layer_name, smallest_threshold_within

__all__ = ["ChannelThresholdKnob", "channel_masks", "gated_mlps"]

_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# The attribute a masked MLP carries, read by export_pretrained.
_ATTR = "_actuator_channel_mask"


def gated_mlps(model: nn.Module) -> dict[str, nn.Module]:
    """Every module with ``nn.Linear`` ``gate_proj``, ``up_proj`` and ``down_proj`` (a gated MLP)."""
    return {n: m for n, m in model.named_modules()
            if all(isinstance(getattr(m, p, None), nn.Linear) for p in _PROJECTIONS)}


class _ChannelMask:
    """Forward pre-hook on ``mlp.down_proj`` multiplying its input by a 0/1 channel mask."""

    def __init__(self, mlp: nn.Module) -> None:
        down = mlp.down_proj
        self.mlp = mlp
        self.width = int(down.in_features)
        self.keep = torch.ones(self.width, dtype=torch.bool)
        self._mask = torch.ones(self.width, device=down.weight.device, dtype=down.weight.dtype)
        self._full = True  # plain bool: no device sync per forward
        self.handle = down.register_forward_pre_hook(self._hook)
        setattr(mlp, _ATTR, self)

    def _hook(self, module: nn.Module, args: tuple) -> tuple | None:
        if self._full:
            return None
        x = args[0]
        if self._mask.device != x.device or self._mask.dtype != x.dtype:
            self._mask = self._mask.to(device=x.device, dtype=x.dtype)
        return (x * self._mask, *args[1:])

    def set(self, keep: torch.Tensor) -> None:
        self.keep = keep.detach().to(device="cpu", dtype=torch.bool).clone()
        self._mask = self.keep.to(device=self._mask.device, dtype=self._mask.dtype)
        self._full = bool(self.keep.all())

    @property
    def kept(self) -> int:
        return int(self.keep.sum())

    def remove(self) -> None:
        self.handle.remove()
        if getattr(self.mlp, _ATTR, None) is self:
            delattr(self.mlp, _ATTR)


def channel_masks(model: nn.Module) -> dict[str, torch.Tensor]:
    """The kept-channel mask (bool, CPU) of every MLP a :class:`ChannelThresholdKnob` masks."""
    return {n: getattr(m, _ATTR).keep for n, m in model.named_modules() if hasattr(m, _ATTR)}


def _channel_params(mlp: nn.Module) -> int:
    """Parameters one channel of this MLP owns: a row of gate and up (and their bias entries),
    a column of down."""
    gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    return (gate.in_features + up.in_features + down.out_features
            + (gate.bias is not None) + (up.bias is not None))


@torch.no_grad()
def channel_importance(model: nn.Module, mlps: dict[str, nn.Module], calibration: Iterable[Any]) -> dict[str, torch.Tensor]:
    """``‖h_j‖₂ · ‖W_down[:, j]‖₂`` per channel of each MLP (float64, CPU), with ``h`` the input
    of ``down_proj`` over ``calibration``: the size of what channel j adds to the MLP's output."""
    sums: dict[str, torch.Tensor] = {}

    def make_hook(name: str):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            s = (x * x).sum(dim=0).to(torch.float64)
            sums[name] = s if name not in sums else sums[name] + s

        return hook

    _calibrate(model, {n: (m.down_proj, make_hook(n)) for n, m in mlps.items()}, calibration, sums)
    out = {}
    for name, mlp in mlps.items():
        col = mlp.down_proj.weight.detach().to(torch.float64).pow(2).sum(dim=0)
        out[name] = (sums[name].cpu() * col.cpu()).sqrt()
    return out


class ChannelThresholdKnob(LogThresholdKnob):
    """Global threshold ``τ`` on MLP channel importance (log scale); masks each layer's channels.

    Args:
        model: a transformers model with gated MLPs (``gate_proj`` / ``up_proj`` / ``down_proj``
            ``nn.Linear``; not factorised ones).
        calibration: batches (dicts of model inputs or input-id tensors) the importance is
            measured on, once, with every channel in (a few dozen sequences).
        min_channels: the fewest channels any layer keeps (its most important ones).
        threshold: the starting ``τ``; default: :attr:`bounds`\\ [0], every channel kept.

    ``read()`` is ``τ``; ``apply(τ)`` keeps in each MLP the channels whose importance is at least
    ``τ`` (at least ``min_channels``, the most important). The masks take effect at the next
    forward; the optimizer is not rebuilt. Masked channels keep their values under plain SGD;
    Adam's momentum from before a cut decays (β1^t) and decoupled weight decay still shrinks
    them, as for :class:`~actuator.agents.compression.LowRankLinear`. The importance is measured
    once: a channel's score is about its role in the model as calibrated, and masks are chosen
    on it alone (no refresh; see the compress-rank benchmark for why a refresh must not resize).
    """

    name = "mlp_channel_threshold"

    def __init__(self, model: nn.Module, calibration: Iterable[Any], *, min_channels: int = 16,
                 threshold: float | None = None) -> None:
        self.model = model
        mlps = gated_mlps(model)
        if not mlps:
            raise KnobNotSupported(
                "ChannelThresholdKnob: the model has no gated MLP with nn.Linear gate_proj, up_proj and down_proj "
                "(Llama / Mistral / Qwen style); factorised MLPs are steered with compression_threshold instead")
        if any(hasattr(m, _ATTR) for m in mlps.values()):
            raise ValueError("model: its MLP channels are already masked by another ChannelThresholdKnob")
        self.calibration = list(calibration)
        if not self.calibration:
            raise ValueError("calibration: ChannelThresholdKnob needs at least one calibration batch")
        if isinstance(min_channels, bool) or not isinstance(min_channels, int) or min_channels < 1:
            raise ValueError(f"min_channels must be an int >= 1, got {min_channels!r}")
        narrowest = min(m.down_proj.in_features for m in mlps.values())
        if min_channels > narrowest:
            raise ValueError(f"min_channels: {min_channels} is more than the narrowest MLP has ({narrowest})")
        self.min_channels = min_channels
        self.scores = channel_importance(model, mlps, self.calibration)
        positive = torch.cat([s[s > 0] for s in self.scores.values()])
        if positive.numel() == 0:
            raise ValueError("calibration: every channel importance is zero (all-zero inputs?)")
        self._bounds = (float(positive.min()), float(positive.max()))
        self._masks = {n: _ChannelMask(m) for n, m in mlps.items()}
        self._per_channel = {n: _channel_params(m) for n, m in mlps.items()}
        self.dense_params = sum(p.numel() for p in model.parameters())
        self._summary_cache: tuple[tuple[int, ...], dict[str, float]] | None = None
        self._tau = self._bounds[0] if threshold is None else self._check(threshold)
        self._set_masks()

    # -- the knob ---------------------------------------------------------------------------
    @property
    def bounds(self) -> tuple[float, float]:
        """From the smallest positive importance (every channel kept) to the largest (every layer
        at ``min_channels``)."""
        return self._bounds

    def _allocate(self) -> None:
        self._set_masks()

    # -- allocation -------------------------------------------------------------------------
    def keep_for(self, threshold: float) -> dict[str, torch.Tensor]:
        """The channels each MLP keeps at ``threshold`` (bool masks; the model is not changed)."""
        tau = self._check(threshold)
        out = {}
        for name, scores in self.scores.items():
            keep = scores >= tau
            if int(keep.sum()) < self.min_channels:
                keep = torch.zeros_like(keep)
                keep[torch.topk(scores, self.min_channels).indices] = True
            out[name] = keep
        return out

    def widths_for(self, threshold: float) -> dict[str, int]:
        """How many channels each MLP keeps at ``threshold``."""
        return {n: int(k.sum()) for n, k in self.keep_for(threshold).items()}

    def _params_for(self, widths: dict[str, int]) -> int:
        return self.dense_params - sum((self._masks[n].width - w) * self._per_channel[n] for n, w in widths.items())

    def params_at(self, threshold: float) -> int:
        """The exported (sliced) model's parameter count at ``threshold``."""
        return self._params_for(self.widths_for(threshold))

    def threshold_for_params(self, params: int, *, iterations: int = 60) -> float:
        """The smallest ``τ`` (bisection in ``log τ``) whose exported model has at most ``params``
        parameters. Raises ``ValueError`` naming ``params`` if the largest threshold cannot."""
        return smallest_threshold_within(self.params_at, params, self._bounds[0] / 2, self._bounds[1] * 2,
                                         f"min_channels {self.min_channels}", iterations)

    def _set_masks(self) -> None:
        for name, keep in self.keep_for(self._tau).items():
            self._masks[name].set(keep)

    # -- what is in effect --------------------------------------------------------------------
    @property
    def widths(self) -> dict[str, int]:
        """Channels each MLP keeps now, read from the masks the forward uses."""
        return {n: m.kept for n, m in self._masks.items()}

    def summary(self) -> dict[str, float]:
        """Metrics for observations and trainer logs: the exported parameter count and its share
        of the dense model, the mean and narrowest width, and each MLP's width
        (``compression.width.<layer>``, for up to 128 MLPs)."""
        widths = self.widths
        key = tuple(widths.values())
        if self._summary_cache is None or self._summary_cache[0] != key:
            params = self._params_for(widths)
            out = {
                "compression.params": float(params),
                "compression.param_ratio": params / self.dense_params,
                "compression.width_mean": sum(widths.values()) / len(widths),
                "compression.width_min": float(min(widths.values())),
                "compression.pruned_channels": float(sum(self._masks[n].width - w for n, w in widths.items())),
            }
            if len(widths) <= 128:
                for name, w in widths.items():
                    out[f"compression.width.{short_layer_name(name)}"[:64]] = float(w)
            self._summary_cache = (key, out)
        return dict(self._summary_cache[1])

    def remove(self) -> None:
        """Detach the masks: every channel is in again, and the model is as it was."""
        for m in self._masks.values():
            m.remove()
        self._masks = {}


register_calibrated("mlp_channel_threshold", "actuator.agents.compression.ChannelThresholdKnob(model, calibration)")
