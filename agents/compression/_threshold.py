"""``compression_threshold``: one threshold on component sensitivities sets every layer's rank.

With an activation-aware factorisation, dropping component i of a layer costs its sensitivity
``e_i`` (the whitened ``σ_i²``, :func:`component_sensitivities`) in squared output error on the
calibration data. Keeping, in every layer, the components whose ``e_i`` is at least one global
``τ`` is the greedy loss-optimal *non-uniform* allocation (SVD-LLM, ASVD, FWSVD): a layer with a
steep spectrum ends at a low rank, a flat one keeps more. A layer whose rank at ``τ`` is at or
above its parameter break-even (``in·out/(in+out)``) stays dense: its factors would not be
smaller, so the layer runs at its full factorised rank and :func:`export_pretrained` writes the
dense weight.

Why a threshold and not a parameter budget as the controlled scalar: both map to the same
allocations (a budget is a τ found by bisection), but τ is the quantity the allocation is
optimal *for*, and its effect on perplexity is smooth on a log scale (the sensitivities span
many decades). :meth:`ThresholdKnob.threshold_for_params` gives the budget view for open-loop use.

Re-measuring the sensitivities while fine-tuning (:meth:`ThresholdKnob.refresh`) moves
parameters from layers that fine-tuning made less sensitive to those it made more so, at the
size in effect: how far to cut stays the controller's decision, made on what the probe measures.
(Re-applying the same τ to the new sensitivities would let a refresh resize the model between
decisions; the compress-rank benchmark's Actuator arm went over its budget right after one.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from actuator._exceptions import ConfigError

from ..knobs import KnobNotSupported, knob_setter
from ._lowrank import LowRankLinear, break_even_rank, component_sensitivities, compression_stats, lowrank_layers

__all__ = ["ThresholdKnob"]

# At most this many layers get their own ``compression.rank.<layer>`` metric per observation
# (the wire format allows 256 values); beyond it only the aggregates are reported.
_PER_LAYER_METRICS_MAX = 128


def short_layer_name(name: str) -> str:
    """A module name without the decoder-stack prefix (for per-layer metric keys)."""
    for prefix in ("model.layers.", "model.decoder.layers.", "transformer.h.", "layers."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def check_threshold(name: str, value: Any) -> float:
    """A log-scale threshold knob's value: a finite number > 0, or ``ValueError`` naming ``name``."""
    try:
        tau = float(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: must be a positive number, got {value!r}") from exc
    if not math.isfinite(tau) or tau <= 0:
        raise ValueError(f"{name}: must be a finite number > 0 (a log-scale knob), got {value!r}")
    return tau


def smallest_threshold_within(params_at: Callable[[float], int], params: int, low: float, high: float,
                              floor: str, iterations: int = 60) -> float:
    """The smallest threshold in [low, high] (bisection in log) at which ``params_at`` is at most
    ``params`` (``params_at`` falls as the threshold rises); ``ValueError`` naming ``params`` if
    even ``high`` is above it (``floor`` says what limits the smallest model)."""
    lo, hi = math.log(low), math.log(high)
    if params_at(math.exp(hi)) > params:
        raise ValueError(f"params: {params} is below the smallest model this knob reaches "
                         f"({params_at(math.exp(hi))} at {floor})")
    if params_at(math.exp(lo)) <= params:
        return math.exp(lo)
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if params_at(math.exp(mid)) <= params:
            hi = mid
        else:
            lo = mid
    return math.exp(hi)


class LogThresholdKnob:
    """What the threshold knobs share: the value is a log-scale threshold (``check_threshold``),
    ``apply`` checks it, stores it and re-allocates (``_allocate``), ``read`` returns it."""

    name: str
    _tau: float

    def read(self) -> float:
        return self._tau

    def apply(self, value: float) -> float:
        self._tau = self._check(value)
        self._allocate()
        return self.read()

    def _check(self, value: float) -> float:
        return check_threshold(self.name, value)

    def _allocate(self) -> None:
        raise NotImplementedError


class ThresholdKnob(LogThresholdKnob):
    """Global threshold ``τ`` on component sensitivities (log scale); sets each layer's active rank.

    Args:
        model: a model with :class:`LowRankLinear` layers (``factorize(model, calibration=...)``).
        calibration: batches (dicts of model inputs or input-id tensors) on which the
            sensitivities are measured: a few dozen sequences, kept by the knob for refreshes.
        refresh_every: measure the sensitivities again every this many optimizer steps
            (:meth:`step_end`; ``None``: only at construction and on :meth:`refresh`).
        min_rank: the lowest rank any layer is cut to.
        threshold: the starting ``τ``; default: :meth:`dense_threshold` (every layer dense, the
            uncompressed model).
        normalize: compare each component's share of its layer's output energy
            (``e_i / Σ_j e_j``, τ in (0, 1]) instead of its absolute ``e_i``. Absolute energies
            are the loss-optimal allocation *of output error*, but layers' outputs do not weigh
            alike in the model's loss (SmolLM2's span ten decades, and a cut in a small-output
            layer can cost more perplexity than a large one elsewhere); the relative form is
            scale-free per layer. Which one reaches the smaller model within a budget is an
            empirical question per model (the compress-rank benchmark measures both offline).

    The knob takes over the layers' active ranks at construction. ``read()`` is ``τ``;
    ``apply(τ)`` sets, in each layer, ``k = #{i : e_i ≥ τ}`` (at least ``min_rank``) — the
    first k components, since truncation keeps a prefix (the sensitivities are sorted after the
    SVD and stay nearly so while fine-tuning) — or the full rank where ``k`` is at or above the
    layer's break-even. A refresh keeps ``τ`` and the parameter count, and re-allocates the
    ranks (:meth:`refresh`). Growing back is lowering ``τ``: masked components come back with their
    kept values (see :class:`LowRankLinear`). Do not drive the uniform ``rank`` knob on the same
    layers at the same time.
    """

    name = "compression_threshold"

    def __init__(
        self,
        model: nn.Module,
        calibration: Iterable[Any],
        *,
        refresh_every: int | None = 50,
        min_rank: int = 1,
        threshold: float | None = None,
        normalize: bool = False,
    ) -> None:
        self.model = model
        self._layers: dict[str, LowRankLinear] = lowrank_layers(model)
        if not self._layers:
            raise KnobNotSupported(
                "ThresholdKnob: the model has no LowRankLinear layers; call "
                "actuator.agents.compression.factorize(model, calibration=...) before building the optimizer"
            )
        self.calibration = list(calibration)
        if not self.calibration:
            raise ValueError("calibration: ThresholdKnob needs at least one calibration batch")
        if refresh_every is not None and (isinstance(refresh_every, bool) or not isinstance(refresh_every, int)
                                          or refresh_every < 1):
            raise ValueError(f"refresh_every must be an int >= 1 or None, got {refresh_every!r}")
        if isinstance(min_rank, bool) or not isinstance(min_rank, int) or min_rank < 1:
            raise ValueError(f"min_rank must be an int >= 1, got {min_rank!r}")
        self.refresh_every = refresh_every
        self.min_rank = min_rank
        self.normalize = bool(normalize)
        self.refreshes = 0
        self.scores: dict[str, torch.Tensor] = {}
        self.score_scale = 1.0
        # Export parameters outside the knob's layers (embeddings, attention, norms, biases):
        # constant, so a size is this plus each layer's own count (no module walk per query).
        stats = compression_stats(model)
        self._other_params = int(stats["model"]["export_params"]) - sum(
            int(stats["layers"][n]["export_params"]) for n in self._layers)
        self._summary_cache: tuple[tuple[int, ...], dict[str, Any]] | None = None
        self._measure()
        positive = torch.cat([s[s > 0] for s in self.scores.values()])
        if positive.numel() == 0:
            raise ValueError("calibration: every component sensitivity is zero (all-zero inputs?)")
        self._bounds = (self.dense_threshold(), float(positive.max()))
        self._tau = self._bounds[0] if threshold is None else self._check(threshold)
        self._set_ranks()

    # -- the knob ---------------------------------------------------------------------------
    @property
    def bounds(self) -> tuple[float, float]:
        """From :meth:`dense_threshold` at construction (every layer dense: the uncompressed
        model; a lower ``τ`` changes nothing) to the largest sensitivity (every layer cut to
        ``min_rank``)."""
        return self._bounds

    def dense_threshold(self) -> float:
        """The largest ``τ`` at which every layer still stays dense, on the current sensitivities:
        the point where compression starts. Layers whose max rank is below their break-even
        (never dense) are left out; if every layer is such, the smallest positive sensitivity."""
        points = []
        for name, layer in self._layers.items():
            keep = math.ceil(break_even_rank(layer.in_features, layer.out_features))
            if keep <= layer.max_rank:
                ordered = torch.sort(self.scores[name], descending=True).values
                points.append(float(ordered[keep - 1]))
        positive = [p for p in points if p > 0]
        if positive:
            return min(positive)
        return float(torch.cat([s[s > 0] for s in self.scores.values()]).min())

    def _allocate(self) -> None:
        self._set_ranks()

    # -- allocation ---------------------------------------------------------------------------
    def ranks_for(self, threshold: float) -> dict[str, int]:
        """The active rank each layer gets at ``threshold`` (its max rank where it stays dense)."""
        tau = self._check(threshold)
        out = {}
        for name, layer in self._layers.items():
            k = max(self.min_rank, int((self.scores[name] >= tau).sum()))
            k = min(k, layer.max_rank)
            if k >= break_even_rank(layer.in_features, layer.out_features):
                k = layer.max_rank  # the factors would not be smaller: keep the layer whole
            out[name] = k
        return out

    def _set_ranks(self) -> None:
        for name, k in self.ranks_for(self._tau).items():
            self._layers[name].active_rank = k

    def _params_for(self, ranks: dict[str, int]) -> int:
        """The exported parameter count with these ranks (as :func:`compression_stats` counts it)."""
        total = self._other_params
        for name, k in ranks.items():
            layer = self._layers[name]
            i, o = layer.in_features, layer.out_features
            total += (k * (i + o) if k * (i + o) < i * o else i * o) + (o if layer.bias is not None else 0)
        return total

    def params_at(self, threshold: float) -> int:
        """The exported model's parameter count at ``threshold`` (the model is left as it was)."""
        return self._params_for(self.ranks_for(threshold))

    def threshold_for_params(self, params: int, *, iterations: int = 60) -> float:
        """The smallest ``τ`` (bisection in ``log τ``) whose exported model has at most ``params``
        parameters: the parameter-budget view of this knob. Raises ``ValueError`` naming
        ``params`` if even the largest threshold cannot reach it."""
        positive = torch.cat([s[s > 0] for s in self.scores.values()])
        return smallest_threshold_within(self.params_at, params, min(self._bounds[0], float(positive.min())) / 2,
                                         max(self._bounds[1], float(positive.max())) * 2,
                                         f"min_rank {self.min_rank}", iterations)

    def _equal_size_threshold(self, params: int, iterations: int = 60) -> float:
        """A ``τ`` on the current sensitivities whose model has the largest count not above
        ``params``: the geometric middle of the interval of such ``τ`` (a later decision then
        cuts or grows about as readily as before), or its top end when that count is the
        uncompressed one (the next rise starts cutting, as at :meth:`dense_threshold`)."""
        low = self.threshold_for_params(params, iterations=iterations)
        count = self.params_at(low)
        a, b = math.log(low), math.log(max(self._bounds[1], max(float(s.max()) for s in self.scores.values())) * 2)
        if self.params_at(math.exp(b)) >= count:
            return math.exp(b)
        for _ in range(iterations):
            mid = (a + b) / 2
            if self.params_at(math.exp(mid)) >= count:
                a = mid
            else:
                b = mid
        high = math.exp(a)
        uncompressed = self._params_for({n: layer.max_rank for n, layer in self._layers.items()})
        return high if count >= uncompressed else math.sqrt(low * high)

    # -- sensitivities ------------------------------------------------------------------------
    def _measure(self) -> None:
        scores = component_sensitivities(self.model, self.calibration)
        if self.normalize:
            scores = {n: e / e.sum().clamp_min(1e-300) for n, e in scores.items()}
        self.scores = {n: e * self.score_scale for n, e in scores.items()}

    def refresh(self) -> dict[str, int]:
        """Measure the sensitivities on the model as it is now and re-allocate the ranks *at the
        same size*; returns the ranks.

        Only a decision may change how much is cut: a refresh that re-applied the same ``τ`` to
        the new sensitivities would grow or shrink the model by itself, between decisions, and
        the controller would see perplexity move with no decision to account for it. So the new
        sensitivities are rescaled by one common factor (``score_scale``, accumulated over
        refreshes) chosen so that ``τ`` in effect keeps the exported parameter count it had
        (the largest count not above it: ranks are integers). What the refresh does change is
        *where* the parameters go: layers that fine-tuning made more sensitive get components
        back from those it made less so, which is the loss-optimal allocation at that size. ``τ``
        itself, and so the controller's state, is unchanged.
        """
        before = self._params_for(self.ranks)
        self.score_scale = 1.0
        self._measure()
        equal = self._equal_size_threshold(before)
        # keep ⇔ e_i ≥ τ' ⇔ c·e_i ≥ τ with c = τ / τ'
        self.score_scale = self._tau / equal
        self.scores = {n: e * self.score_scale for n, e in self.scores.items()}
        self.refreshes += 1
        self._set_ranks()
        return self.ranks

    def step_end(self, step: int) -> None:
        """Called after each optimizer step (``ActuatorCallback`` does): refresh every
        ``refresh_every`` steps."""
        if self.refresh_every and step > 0 and step % self.refresh_every == 0:
            self.refresh()

    # -- what is in effect ------------------------------------------------------------------------
    @property
    def ranks(self) -> dict[str, int]:
        """The active rank of each layer, read from the layers."""
        return {n: layer.active_rank for n, layer in self._layers.items()}

    def summary(self) -> dict[str, float]:
        """Metrics for observations and trainer logs: the exported parameter count, how many
        layers are dense, the ranks of the factored ones and, for up to 128 layers, each
        layer's rank (``compression.rank.<layer>``)."""
        key = tuple(layer.active_rank for layer in self._layers.values())
        if self._summary_cache is None or self._summary_cache[0] != key:
            # Every observation and trainer log asks; the stats change only with the ranks.
            self._summary_cache = (key, self._summarize())
        return {**self._summary_cache[1], "compression.refreshes": float(self.refreshes)}

    def _summarize(self) -> dict[str, float]:
        stats = compression_stats(self.model)
        layers = stats["layers"]
        factored = [s["active_rank"] for n, s in layers.items() if n in self._layers and not s["export_dense"]]
        out = {
            "compression.params": float(stats["model"]["export_params"]),
            "compression.param_ratio": float(stats["model"]["export_param_ratio"]),
            "compression.dense_layers": float(sum(1 for n in self._layers if layers[n]["export_dense"])),
            "compression.factored_layers": float(len(factored)),
            "compression.rank_mean": float(sum(factored) / len(factored)) if factored else 0.0,
        }
        if len(self._layers) <= _PER_LAYER_METRICS_MAX:
            for name, layer in self._layers.items():
                out[f"compression.rank.{short_layer_name(name)}"[:64]] = float(layer.active_rank)
        return out


def register_calibrated(name: str, hint: str) -> None:
    """A knob whose setter measures on calibration data: the callback cannot build it from the
    trainer, so the registration says what to pass."""

    @knob_setter(name, hint=hint)
    def calibrated(**_: Any) -> Any:
        raise ConfigError(f"knobs.{name}: the threshold knob measures sensitivities on calibration data the "
                          f"callback does not have; pass setters=[{hint}]")


register_calibrated("compression_threshold", "actuator.agents.compression.ThresholdKnob(model, calibration)")
