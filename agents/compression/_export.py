"""Export a compressed model as a ``transformers`` model that loads without Actuator.

A factorised layer becomes a pair of plain ``nn.Linear`` (``in → k → out``, the truncated factors,
``diag(s)`` folded into the first) where that is smaller than the dense weight, and an
``nn.Linear`` holding the product where it is not. Dense layers everywhere: the directory is an
ordinary checkpoint of the original architecture. Any layer factored: transformers' stock
architectures have no place for a per-layer inner dimension (a Llama MLP's projections are
``nn.Linear(hidden, intermediate)`` with one ``intermediate_size`` for every layer), so the
directory also holds a 50-line ``modeling_actuator_lowrank.py`` that subclasses the original
class and swaps the recorded projections for factor pairs (or, for MLPs with pruned channels,
for narrower ``nn.Linear``: one width per layer) before the weights load. It imports
only ``torch`` and ``transformers``; ``config.json`` names it in ``auto_map``, and it loads with
``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`` (transformers' own
mechanism for architectures it does not ship; the code is in the directory, nothing is fetched).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
from torch import nn

from ._lowrank import LowRankLinear, TruncatedLinear, _set_submodule
from ._width import channel_masks

__all__ = ["MODELING_FILE", "export_pretrained"]

MODELING_FILE = "modeling_actuator_lowrank.py"

_MODELING = '''"""Compressed {base}, written by Actuator's export_pretrained.

Needs only torch and transformers: load with
    AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)
config.factored_layers maps a module name to the shape of the factor pair that replaces it:
an nn.Linear(in, rank) followed by an nn.Linear(rank, out), keys "<name>.0.weight" and
"<name>.1.weight" (and "<name>.1.bias"). config.resized_layers maps a module name to the shape
of the nn.Linear that replaces it (an MLP projection with pruned channels: each layer has its
own intermediate width). Every other module is the original architecture's.
"""

from torch import nn
from transformers import {base} as _Base


def _factor(model, config):
    for name, spec in (getattr(config, "resized_layers", None) or {{}}).items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, nn.Linear(spec["in_features"], spec["out_features"], bias=spec["bias"]))
    for name, spec in (getattr(config, "factored_layers", None) or {{}}).items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        pair = nn.Sequential(
            nn.Linear(spec["in_features"], spec["rank"], bias=False),
            nn.Linear(spec["rank"], spec["out_features"], bias=spec["bias"]),
        )
        setattr(parent, child, pair)


class {cls}(_Base):
    def post_init(self):
        # The base __init__ has built every module and calls post_init last: swap the factored
        # projections in first, so weight initialisation and tying see the final modules.
        _factor(self, self.config)
        super().post_init()
'''


def _pair(in_proj_weight: torch.Tensor, out_proj_weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Sequential:
    rank = in_proj_weight.shape[0]
    first = nn.Linear(in_proj_weight.shape[1], rank, bias=False, device=in_proj_weight.device,
                      dtype=in_proj_weight.dtype)
    second = nn.Linear(rank, out_proj_weight.shape[0], bias=bias is not None, device=out_proj_weight.device,
                       dtype=out_proj_weight.dtype)
    first.weight.copy_(in_proj_weight)
    second.weight.copy_(out_proj_weight)
    if bias is not None:
        second.bias.copy_(bias)
    return nn.Sequential(first, second)


def _dense(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    out_f, in_f = weight.shape
    layer = nn.Linear(in_f, out_f, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    layer.weight.copy_(weight)
    if bias is not None:
        layer.bias.copy_(bias)
    return layer


@torch.no_grad()
def export_pretrained(model: nn.Module, path: str | os.PathLike[str], tokenizer: Any | None = None,
                      *, safe_serialization: bool = True) -> dict[str, Any]:
    """Write ``model`` (with :class:`LowRankLinear` / :class:`TruncatedLinear` layers) to ``path``
    as a ``transformers`` checkpoint, at the ranks in effect; ``model`` itself is not changed.

    Each low-rank layer at rank ``k`` is written as its truncated factors
    (``in_proj = diag(s[:k])·Vh[:k]``, ``out_proj = U[:, :k]``) when ``k·(in+out) < in·out``, else
    as one dense ``nn.Linear`` holding their product: an exported layer is never larger than the
    original. An MLP whose channels a :class:`~actuator.agents.compression.ChannelThresholdKnob`
    masks is written with only its kept channels (rows of ``gate_proj`` / ``up_proj``, columns of
    ``down_proj``): when every MLP keeps the same width the config's ``intermediate_size`` says
    so and no custom code is needed; otherwise ``config.resized_layers`` records each
    projection's shape for the modeling file. The tokenizer is saved beside it when given.

    Returns ``{"path", "params", "file_bytes", "factored_layers", "dense_layers", "pruned_mlps",
    "custom_code"}``:
    ``params`` counts the exported model's unique parameters, ``file_bytes`` the weight files on
    disk, ``custom_code`` whether the modeling file was needed (see the module docstring).
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "save_pretrained"):
        raise ValueError("export_pretrained needs a transformers PreTrainedModel (with .config and save_pretrained)")
    lowrank = [(n, m) for n, m in model.named_modules() if isinstance(m, (LowRankLinear, TruncatedLinear))]
    masks = channel_masks(model)
    if not lowrank and not masks:
        raise ValueError("export_pretrained: the model has no LowRankLinear or TruncatedLinear layers and no "
                         "masked MLP channels (ChannelThresholdKnob)")
    path = os.fspath(path)
    out = copy.deepcopy(model)
    resized = _slice_channels(out, masks)
    factored: dict[str, dict[str, Any]] = {}
    dense = 0
    for name, _ in lowrank:
        m = out.get_submodule(name)
        if isinstance(m, LowRankLinear):
            k = m.active_rank
            a, b, bias = m.s[:k, None] * m.vh[:k], m.u[:, :k], m.bias
        else:
            assert isinstance(m, TruncatedLinear)
            k = m.rank
            a, b, bias = m.in_proj.weight, m.out_proj.weight, m.out_proj.bias
        a, b = a.detach().clone(), b.detach().clone()
        bias = None if bias is None else bias.detach().clone()
        if k * (m.in_features + m.out_features) < m.in_features * m.out_features:
            _set_submodule(out, name, _pair(a, b, bias))
            factored[name] = {"in_features": m.in_features, "out_features": m.out_features, "rank": k,
                              "bias": bias is not None}
        else:
            _set_submodule(out, name, _dense(b @ a, bias))
            dense += 1
    out.config = copy.deepcopy(config)
    base = type(model).__name__
    widths = {spec["out_features"] for n, spec in resized.items() if n.endswith(".up_proj")}
    uniform = bool(resized) and len(widths) == 1 and len(resized) == 3 * _gated_mlp_count(out)
    if uniform and hasattr(out.config, "intermediate_size"):
        # Every MLP kept the same width: the stock architecture with a smaller intermediate_size.
        out.config.intermediate_size = widths.pop()
        resized = {}
    custom = bool(factored or resized)
    if custom:
        cls = f"ActuatorLowRank{base}" if factored else f"ActuatorPruned{base}"
        if factored:
            out.config.factored_layers = factored
        if resized:
            out.config.resized_layers = resized
        out.config.auto_map = {"AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.{cls}"}
        out.config.architectures = [cls]
    os.makedirs(path, exist_ok=True)
    out.save_pretrained(path, safe_serialization=safe_serialization)
    if custom:
        with open(os.path.join(path, MODELING_FILE), "w", encoding="utf-8") as fh:
            fh.write(_MODELING.format(base=base, cls=cls))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    params = sum(p.numel() for p in out.parameters())
    file_bytes = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                     if f.endswith((".safetensors", ".bin")))
    del out
    return {"path": path, "params": int(params), "file_bytes": int(file_bytes), "factored_layers": len(factored),
            "dense_layers": dense, "pruned_mlps": len(masks), "custom_code": custom}


def _gated_mlp_count(model: nn.Module) -> int:
    from ._width import gated_mlps

    return len(gated_mlps(model))


def _slice_channels(model: nn.Module, masks: dict[str, torch.Tensor]) -> dict[str, dict[str, Any]]:
    """Replace the projections of each masked MLP of ``model`` (a copy) by ``nn.Linear`` holding
    only the kept channels; returns their shapes by module name (``config.resized_layers``)."""
    from ._width import _ATTR

    shapes: dict[str, dict[str, Any]] = {}
    for name, keep in masks.items():
        mlp = model.get_submodule(name)
        mask = getattr(mlp, _ATTR, None)
        if mask is not None:
            mask.handle.remove()  # the copy's hook: the sliced layers need no mask
            delattr(mlp, _ATTR)
        idx = torch.nonzero(keep).flatten()
        for proj, rows in (("gate_proj", True), ("up_proj", True), ("down_proj", False)):
            old = getattr(mlp, proj)
            if not isinstance(old, nn.Linear):
                raise ValueError(f"export_pretrained: {name}.{proj} is a {type(old).__name__}; an MLP with masked "
                                 "channels must keep plain nn.Linear projections")
            idx_d = idx.to(old.weight.device)
            weight = old.weight[idx_d] if rows else old.weight[:, idx_d]
            bias = None if old.bias is None else (old.bias[idx_d] if rows else old.bias)
            setattr(mlp, proj, _dense(weight, bias))
            shapes[f"{name}.{proj}"] = {"in_features": int(weight.shape[1]), "out_features": int(weight.shape[0]),
                                        "bias": bias is not None}
    return shapes
