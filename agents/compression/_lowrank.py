"""Low-rank factorised linear layers with an active rank that changes mid-run.

``LowRankLinear`` keeps ``W ≈ U·diag(s)·Vh`` (an SVD of the original weight) for a fixed *max
rank* R and an integer *active rank* k ≤ R. The forward pass slices the factors to k, so it costs
``2·k·(in+out)`` FLOPs per token and components k..R contribute nothing. Changing k is a Python
attribute write: no parameter is created or dropped, so the optimizer keeps its param groups and
state, and the change takes effect at the next forward.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DEFAULT_MLP_TARGETS",
    "LowRankLinear",
    "TruncatedLinear",
    "factorize",
    "input_grams",
    "set_active_rank",
    "active_rank",
    "active_ranks",
    "lowrank_layers",
    "compression_stats",
    "export_truncated",
    "break_even_rank",
    "component_sensitivities",
]

#: Llama / Mistral / Qwen / SmolLM MLP projections.
DEFAULT_MLP_TARGETS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")


def _resolve_rank(rank: int | float, full: int, what: str) -> int:
    """An absolute rank (int ≥ 1, clipped to ``full``) or a fraction in (0, 1] of ``full``.

    ``1`` means rank one and ``1.0`` means full rank: the type decides, so a controller sending
    floats for an integer knob must round first (``RankKnob`` does).
    """
    if isinstance(rank, bool) or not isinstance(rank, (int, float)):
        raise TypeError(f"{what} must be an int (absolute) or a float fraction, got {rank!r}")
    if isinstance(rank, float):
        if not (0.0 < rank <= 1.0) or math.isnan(rank):
            raise ValueError(f"{what} as a fraction must be in (0, 1], got {rank}")
        return max(1, min(full, round(rank * full)))
    if rank < 1:
        raise ValueError(f"{what} must be >= 1, got {rank}")
    return min(int(rank), full)


class LowRankLinear(nn.Module):
    """``y = U[:, :k] · diag(s[:k]) · Vh[:k] · x + b`` with a mutable active rank ``k``.

    Parameters (all trainable, names follow ``torch.linalg.svd``): ``u`` (out × R), ``s`` (R),
    ``vh`` (R × in) and the original ``bias`` if any. Built with :meth:`from_linear`; at full
    rank the output equals the original layer's up to float rounding (the SVD runs in float64).

    Masked components (index ≥ active rank), while masked:

    * contribute nothing to the output: the forward slices them away rather than multiplying by a
      mask, so the cost really is that of rank k;
    * receive an exactly zero gradient: they are sliced out of the autograd graph, yet their
      parameters are still used (sliced), so ``.grad`` is a full-shape tensor with zeros there and
      DDP does not need ``find_unused_parameters``;
    * keep their values under plain SGD. Optimizers with state still move them a little: Adam's
      momentum from before the shrink decays geometrically (β1^t) and decoupled weight decay
      shrinks them by (1 − lr·wd) per step (HF's default weight decay is 0; note ``s`` is not
      in HF's no-decay patterns). A component masked from the start has zero Adam state and does
      not move at all.

    Growing back re-enables the kept values (trained until they were masked, then as above), so
    regrowth restarts from where the component was, not from zero and not from the SVD.

    The active rank is a Python int (no device sync per forward); it is saved in the module's
    state dict as extra state, so checkpoints restore it. Under ``torch.compile`` each distinct
    rank is a new shape and triggers a recompile.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        max_rank: int,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        if not 1 <= max_rank <= min(in_features, out_features):
            raise ValueError(
                f"max_rank must be in [1, {min(in_features, out_features)}], got {max_rank}"
            )
        kw = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.max_rank = max_rank
        self.u = nn.Parameter(torch.empty(out_features, max_rank, **kw))
        self.s = nn.Parameter(torch.empty(max_rank, **kw))
        self.vh = nn.Parameter(torch.empty(max_rank, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        self._active_rank = max_rank

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        max_rank: int | float | None = None,
        init_rank: int | float | None = None,
        input_gram: torch.Tensor | None = None,
    ) -> LowRankLinear:
        """Factorise ``linear`` by SVD (float64, then cast back to the layer's dtype).

        Plain (``input_gram=None``): ``W = U·diag(s)·Vh``, so truncation to k minimises
        ``‖W − W_k‖_F`` (Eckart–Young).

        Activation-aware (``input_gram = Σ x xᵀ`` over calibration inputs, in × in; SVD-LLM,
        Wang et al. 2024): with ``G + δI = L·Lᵀ`` (Cholesky, δ = 1e-3 × mean diagonal), the SVD
        ``W·L = U·diag(s)·Ṽh`` gives ``vh = Ṽh·L⁻¹``; truncation to k then minimises the output
        error ``‖(W − W_k)·X‖_F`` on the calibration inputs instead of the weight error. Full
        rank is still ``W`` (exactly in real arithmetic). The rows of ``vh`` are then rescaled to
        unit norm with the norms moved into ``s``, so the three factors have SVD-like scales for
        the optimizer; ``s`` is then not sorted, but index order is still the truncation order.
        """
        full = min(linear.in_features, linear.out_features)
        r_max = full if max_rank is None else _resolve_rank(max_rank, full, "max_rank")
        weight = linear.weight.detach()
        layer = cls(
            linear.in_features,
            linear.out_features,
            r_max,
            bias=linear.bias is not None,
            device=weight.device,
            dtype=weight.dtype,
        )
        w64 = weight.to(torch.float64)
        if input_gram is None:
            u, s, vh = torch.linalg.svd(w64, full_matrices=False)
        else:
            gram = input_gram.to(device=w64.device, dtype=torch.float64)
            if gram.shape != (linear.in_features, linear.in_features):
                raise ValueError(f"input_gram must be {linear.in_features}x{linear.in_features}, got {tuple(gram.shape)}")
            damp = 1e-3 * gram.diagonal().mean().clamp_min(1e-12)
            chol = torch.linalg.cholesky(gram + damp * torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device))
            u, s, vh_w = torch.linalg.svd(w64 @ chol, full_matrices=False)
            vh = torch.linalg.solve_triangular(chol, vh_w, upper=False, left=False)  # vh · L = vh_w
            # Rows of vh come out scaled by L⁻¹ (tiny or huge, with activation outliers); Adam
            # moves every entry by ~lr whatever its scale, so rebalance: unit rows, norms into s.
            # The product is unchanged and the component order (the truncation order) is kept.
            norms = vh.norm(dim=1).clamp_min(1e-30)
            vh = vh / norms[:, None]
            s = s * norms
        with torch.no_grad():
            layer.u.copy_(u[:, :r_max])
            layer.s.copy_(s[:r_max])
            layer.vh.copy_(vh[:r_max])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias.detach())
        layer.u.requires_grad_(linear.weight.requires_grad)
        layer.s.requires_grad_(linear.weight.requires_grad)
        layer.vh.requires_grad_(linear.weight.requires_grad)
        if init_rank is not None:
            layer.active_rank = _resolve_rank(init_rank, r_max, "init_rank")
        return layer

    @property
    def active_rank(self) -> int:
        return self._active_rank

    @active_rank.setter
    def active_rank(self, rank: int) -> None:
        rank = int(rank)
        if not 1 <= rank <= self.max_rank:
            raise ValueError(f"active rank must be in [1, {self.max_rank}], got {rank}")
        self._active_rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self._active_rank
        # Row slice of vh is contiguous; the column slice of u is a strided view that matmul
        # consumes with a leading dimension, no copy.
        h = F.linear(x, self.vh[:k]) * self.s[:k]
        return F.linear(h, self.u[:, :k], self.bias)

    @torch.no_grad()
    def dense_weight(self, rank: int | None = None) -> torch.Tensor:
        """The (out × in) weight this layer applies at ``rank`` (default: the active rank)."""
        k = self._active_rank if rank is None else int(rank)
        return (self.u[:, :k] * self.s[:k]) @ self.vh[:k]

    def get_extra_state(self) -> torch.Tensor:
        # A tensor (not a dict) so safetensors checkpoints can hold it.
        return torch.tensor([self._active_rank], dtype=torch.int64)

    def set_extra_state(self, state: Any) -> None:
        self.active_rank = int(torch.as_tensor(state).reshape(-1)[0].item())

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"max_rank={self.max_rank}, active_rank={self._active_rank}, bias={self.bias is not None}"
        )


class TruncatedLinear(nn.Module):
    """A real rank-r pair ``out_proj(in_proj(x))``: ``in_proj`` (in→r, no bias), ``out_proj`` (r→out).

    What :func:`export_truncated` leaves behind: parameters really shrink to ``r·(in+out)`` plus
    the bias. ``in_features`` / ``out_features`` mirror ``nn.Linear`` for code that reads them.
    """

    def __init__(
        self, in_features: int, out_features: int, rank: int, bias: bool = True, device: Any = None, dtype: Any = None
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.rank = rank
        self.in_proj = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.out_proj = nn.Linear(rank, out_features, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.in_proj(x))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


def _matches(name: str, targets: str | Sequence[str]) -> bool:
    # Same convention as PEFT's ``target_modules``: a string is a regex that must match the whole
    # module name; a list/tuple matches a name equal to an entry or ending in "." + entry.
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


@torch.no_grad()
def input_grams(model: nn.Module, names: Sequence[str], calibration: Iterable[Any]) -> dict[str, torch.Tensor]:
    """``Σ x xᵀ`` (float64, in × in) of the inputs each named Linear sees over ``calibration``.

    ``calibration`` yields model inputs: a dict of keyword arguments (e.g. a tokenised batch) or
    a tensor of input ids. The model runs in eval mode under ``no_grad``; its mode is restored.
    """
    grams: dict[str, torch.Tensor] = {}

    def make_hook(name: str):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple) -> None:
            # Per-batch product in float32 (fast on CPU), running sum in float64.
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            g = (x.T @ x).to(torch.float64)
            grams[name] = g if name not in grams else grams[name] + g

        return hook

    _calibrate(model, {name: (model.get_submodule(name), make_hook(name)) for name in names}, calibration, grams)
    return grams


def _calibrate(model: nn.Module, hooks: dict[str, tuple[nn.Module, Any]], calibration: Iterable[Any],
               filled: dict[str, Any]) -> None:
    """Run ``calibration`` through ``model`` (eval mode, mode restored) with a forward pre-hook on
    each named module; every name must then be in ``filled`` (what the hooks write)."""
    handles = [module.register_forward_pre_hook(hook) for module, hook in hooks.values()]
    was_training = model.training
    model.eval()
    try:
        for batch in calibration:
            if isinstance(batch, dict):
                model(**{k: v for k, v in batch.items() if k != "labels"})
            else:
                model(batch)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    missing = [n for n in hooks if n not in filled]
    if missing:
        raise ValueError(f"calibration never reached {missing[:3]}{'...' if len(missing) > 3 else ''}")


def factorize(
    model: nn.Module,
    targets: str | Sequence[str] = DEFAULT_MLP_TARGETS,
    max_rank: int | float | None = None,
    init_rank: int | float | None = None,
    calibration: Iterable[Any] | None = None,
) -> list[str]:
    """Replace matching ``nn.Linear`` modules by :class:`LowRankLinear`, in place.

    ``targets`` follows PEFT's ``target_modules``: a ``str`` is a regex matched against the whole
    dotted module name (``re.fullmatch``), a list/tuple matches names equal to an entry or ending
    in ``"." + entry`` (so ``"up_proj"`` matches ``model.layers.3.mlp.up_proj``).

    ``max_rank`` / ``init_rank``: ``None`` (full rank ``min(in, out)`` / ``max_rank``), an ``int``
    (absolute, clipped per layer) or a ``float`` in (0, 1] (fraction of each layer's full rank /
    of its max rank).

    ``calibration``: optional batches (dicts of model inputs, or input-id tensors). When given,
    the factorisation is activation-aware (see :meth:`LowRankLinear.from_linear`): truncation
    then preserves each layer's outputs on that data rather than its weights, which matters a lot
    for real LLMs whose MLP spectra are flat. A few dozen sequences are enough. All Gram matrices
    are collected in one pass before any layer is replaced.

    Returns the replaced module names. Build the optimizer afterwards: the new parameters replace
    the dense weights.
    """
    names = [
        name
        for name, module in model.named_modules()
        if name and isinstance(module, nn.Linear) and _matches(name, targets)
    ]
    if not names:
        matched_other = [
            f"{n} ({type(m).__name__})" for n, m in model.named_modules() if n and _matches(n, targets)
        ]
        hint = f"; matching non-Linear modules: {matched_other[:5]}" if matched_other else ""
        raise ValueError(f"factorize: no nn.Linear module matches targets {targets!r}{hint}")
    grams = input_grams(model, names, calibration) if calibration is not None else {}
    for name in names:
        linear = model.get_submodule(name)
        gram = grams.pop(name, None)
        _set_submodule(model, name, LowRankLinear.from_linear(linear, max_rank, init_rank, input_gram=gram))
    return names


def lowrank_layers(model: nn.Module) -> dict[str, LowRankLinear]:
    """Every :class:`LowRankLinear` in ``model`` by module name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LowRankLinear)}


def _require_layers(model: nn.Module) -> dict[str, LowRankLinear]:
    layers = lowrank_layers(model)
    if not layers:
        raise ValueError("model has no LowRankLinear layers: call factorize(model, ...) first")
    return layers


def set_active_rank(model: nn.Module, rank: int | float) -> dict[str, int]:
    """Set every layer's active rank; returns the rank now in effect per layer.

    ``int``: one absolute rank for all layers, clipped per layer to its max rank.
    ``float`` in (0, 1]: that fraction of each layer's max rank (rounded, at least 1).
    Takes effect at the next forward; the optimizer is untouched.
    """
    out = {}
    for name, layer in _require_layers(model).items():
        layer.active_rank = _resolve_rank(rank, layer.max_rank, "rank")
        out[name] = layer.active_rank
    return out


def active_ranks(model: nn.Module) -> dict[str, int]:
    """The active rank of each layer, read from the layers."""
    return {n: layer.active_rank for n, layer in _require_layers(model).items()}


def active_rank(model: nn.Module) -> int:
    """The common absolute rank: the largest active rank over the layers.

    After ``set_active_rank(model, k)`` with an int ``k`` every layer has ``min(k, max_rank)``, so
    this returns ``k`` as long as ``k`` ≤ the largest max rank.
    """
    return max(active_ranks(model).values())


def _unique_param_count(model: nn.Module) -> int:
    # parameters() already skips tied duplicates (e.g. lm_head tied to the embeddings).
    return sum(p.numel() for p in model.parameters())


def break_even_rank(in_features: int, out_features: int) -> float:
    """The rank at which a factorisation keeps as many parameters as the dense weight:
    ``in·out / (in + out)`` (419.2 for a 576×1536 projection). Below it the factors are smaller."""
    return in_features * out_features / (in_features + out_features)


def _layer_stats(in_f: int, out_f: int, k: int, stored: int, has_bias: bool, max_rank: int) -> dict:
    bias = out_f if has_bias else 0
    factored = k * (in_f + out_f) < in_f * out_f
    return {
        "in_features": in_f,
        "out_features": out_f,
        "max_rank": max_rank,
        "active_rank": k,
        "dense_params": in_f * out_f + bias,
        "params": k * (in_f + out_f) + bias,
        # What export_pretrained writes: the factors where they are smaller, else the dense weight.
        "export_dense": not factored,
        "export_params": (k * (in_f + out_f) if factored else in_f * out_f) + bias,
        "stored_params": stored,
        "dense_flops_per_token": 2 * in_f * out_f,
        "flops_per_token": 2 * k * (in_f + out_f),
    }


def _ratios(d: dict) -> dict:
    d["param_ratio"] = d["params"] / d["dense_params"] if d["dense_params"] else 1.0
    d["export_param_ratio"] = d["export_params"] / d["dense_params"] if d["dense_params"] else 1.0
    d["flops_ratio"] = d["flops_per_token"] / d["dense_flops_per_token"] if d["dense_flops_per_token"] else 1.0
    return d


def compression_stats(model: nn.Module) -> dict[str, Any]:
    """Parameters and forward FLOPs per token in effect at the active rank vs the dense original.

    Conventions (hand-checkable):

    * ``params`` of a factorised layer is what :func:`export_truncated` keeps: ``k·(in+out)`` plus
      the bias (``s`` is folded into the first factor). ``stored_params`` is what the live
      ``LowRankLinear`` holds now: ``R·(in+out+1)`` plus the bias. ``dense_params`` is
      ``in·out`` plus the bias.
    * FLOPs per token count matmuls only, 2 per multiply-add: ``2·in·out`` dense, ``2·k·(in+out)``
      factorised; biases, the ``diag(s)`` scale, norms, activations, embedding look-ups and
      attention's sequence-length-dependent score/value products are excluded (the usual "2N"
      estimate over every ``nn.Linear``, including ``lm_head``).
    * ``model.params`` counts unique parameters (tied weights once) with every factorised layer at
      its ``params``: it is the parameter count of the :func:`export_truncated` model.
    * ``export_params`` is what :func:`~actuator.agents.compression.export_pretrained` writes: a
      layer whose rank-k factors are not smaller than its dense weight (k ≥ :func:`break_even_rank`)
      is exported dense (``export_dense``), so ``model.export_params`` never exceeds the dense
      model's count.

    Returns ``{"layers": {name: {...}}, "factorized": {...}, "model": {...}}``; the two aggregates
    have ``dense_params``, ``params``, ``export_params``, ``stored_params``,
    ``dense_flops_per_token``, ``flops_per_token``, ``param_ratio``, ``export_param_ratio`` and
    ``flops_ratio``.
    """
    layers: dict[str, dict] = {}
    inner_ids: set[int] = set()
    dense_flops_other = 0
    for name, m in model.named_modules():
        if isinstance(m, LowRankLinear):
            stored = sum(p.numel() for p in m.parameters())
            layers[name] = _layer_stats(m.in_features, m.out_features, m.active_rank, stored, m.bias is not None, m.max_rank)
        elif isinstance(m, TruncatedLinear):
            inner_ids.update((id(m.in_proj), id(m.out_proj)))
            stored = sum(p.numel() for p in m.parameters())
            has_bias = m.out_proj.bias is not None
            layers[name] = _layer_stats(m.in_features, m.out_features, m.rank, stored, has_bias, m.rank)
        elif isinstance(m, nn.Linear) and id(m) not in inner_ids:
            dense_flops_other += 2 * m.in_features * m.out_features
    keys = ("dense_params", "params", "export_params", "stored_params", "dense_flops_per_token", "flops_per_token")
    fact = {k: sum(layer[k] for layer in layers.values()) for k in keys}
    total = _unique_param_count(model)
    other = total - fact["stored_params"]
    whole = {
        "dense_params": other + fact["dense_params"],
        "params": other + fact["params"],
        "export_params": other + fact["export_params"],
        "stored_params": total,
        "dense_flops_per_token": dense_flops_other + fact["dense_flops_per_token"],
        "flops_per_token": dense_flops_other + fact["flops_per_token"],
    }
    return {"layers": layers, "factorized": _ratios(fact), "model": _ratios(whole)}


@torch.no_grad()
def component_sensitivities(model: nn.Module, calibration: Iterable[Any]) -> dict[str, torch.Tensor]:
    """Per :class:`LowRankLinear`, what each of its ``max_rank`` components adds to the layer's
    output on ``calibration``: ``e_i = s_i²·‖u_i‖²·Σ_x (vh_i·x)²`` (float64, length ``max_rank``).

    Right after an activation-aware factorisation (:meth:`LowRankLinear.from_linear` with a
    Gram matrix) the components are orthogonal in the whitened space, so ``e_i`` is the whitened
    ``σ_i²`` (SVD-LLM) and dropping a set of components costs the sum of their ``e_i`` in squared
    output error on that data: one threshold on ``e`` across layers is the greedy loss-optimal
    allocation of ranks. Measured again during fine-tuning (the factors and the inputs each layer
    sees have moved), it is the same quantity for the model as it is now; the components are then
    only nearly orthogonal, so the sum is an estimate.

    Masked components are measured too (each layer's input goes through all ``max_rank`` rows of
    ``vh`` in a hook; the forward itself still runs at the active ranks, so later layers see the
    inputs the compressed model really gives them). Runs in eval mode under ``no_grad``; the mode is
    restored. ``calibration`` yields dicts of model inputs or input-id tensors, as for
    :func:`factorize`.
    """
    layers = _require_layers(model)
    energy: dict[str, torch.Tensor] = {}

    def make_hook(name: str, layer: LowRankLinear):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0].detach().reshape(-1, args[0].shape[-1])
            h = F.linear(x, layer.vh).float()
            e = (h * h).sum(dim=0).to(torch.float64)
            energy[name] = e if name not in energy else energy[name] + e

        return hook

    _calibrate(model, {name: (layer, make_hook(name, layer)) for name, layer in layers.items()}, calibration, energy)
    out = {}
    for name, layer in layers.items():
        scale = layer.s.detach().to(torch.float64) ** 2 * (layer.u.detach().to(torch.float64) ** 2).sum(dim=0)
        out[name] = (energy[name] * scale).cpu()
    return out


@torch.no_grad()
def export_truncated(model: nn.Module) -> nn.Module:
    """Replace every :class:`LowRankLinear` by a :class:`TruncatedLinear` at its active rank, in place.

    ``in_proj.weight = diag(s[:k])·Vh[:k]`` and ``out_proj.weight = U[:, :k]``; the masked
    components are dropped for good. Returns ``model`` (for chaining). Save it with
    :func:`actuator.agents.compression.save_compressed`.
    """
    for name, layer in _require_layers(model).items():
        k = layer.active_rank
        new = TruncatedLinear(
            layer.in_features,
            layer.out_features,
            k,
            bias=layer.bias is not None,
            device=layer.u.device,
            dtype=layer.u.dtype,
        )
        new.in_proj.weight.copy_(layer.s[:k, None] * layer.vh[:k])
        new.out_proj.weight.copy_(layer.u[:, :k])
        if layer.bias is not None:
            new.out_proj.bias.copy_(layer.bias)
        new.train(layer.training)
        _set_submodule(model, name, new)
    return model
