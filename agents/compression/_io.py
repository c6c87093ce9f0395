"""Save and load compressed models: config + safetensors weights + a JSON manifest of the ranks.

``from_pretrained`` does not know :class:`LowRankLinear` / :class:`TruncatedLinear`, so the
loader rebuilds the model from its config (``model_class(config)``), swaps in empty low-rank
modules of the recorded shapes, then loads the weights strictly: a missing or unexpected key is
an error, never a silently random layer.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn

from ._lowrank import LowRankLinear, TruncatedLinear, _set_submodule

__all__ = ["MANIFEST_NAME", "WEIGHTS_NAME", "save_compressed", "load_compressed"]

MANIFEST_NAME = "actuator_compression.json"
WEIGHTS_NAME = "model.safetensors"
_FORMAT = "actuator.compression"
_VERSION = 1


def _manifest(model: nn.Module) -> dict[str, Any]:
    modules: dict[str, dict[str, Any]] = {}
    for name, m in model.named_modules():
        if isinstance(m, TruncatedLinear):
            modules[name] = {
                "kind": "truncated",
                "in_features": m.in_features,
                "out_features": m.out_features,
                "rank": m.rank,
                "bias": m.out_proj.bias is not None,
            }
        elif isinstance(m, LowRankLinear):
            modules[name] = {
                "kind": "lowrank",
                "in_features": m.in_features,
                "out_features": m.out_features,
                "max_rank": m.max_rank,
                "active_rank": m.active_rank,
                "bias": m.bias is not None,
            }
    if not modules:
        raise ValueError("save_compressed: the model has no LowRankLinear or TruncatedLinear layers")
    return {
        "format": _FORMAT,
        "version": _VERSION,
        "model_class": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "modules": modules,
    }


def save_compressed(model: nn.Module, path: str | os.PathLike[str]) -> str:
    """Write ``config.json`` (+ generation config), ``model.safetensors`` and the rank manifest.

    Works on exported models (:class:`TruncatedLinear`, the deployable form) and on live
    factorised ones (:class:`LowRankLinear`: all R components and the active rank are kept, so
    training can resume). Tied weights are stored once. Returns the directory.
    """
    from safetensors.torch import save_model

    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    manifest = _manifest(model)
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError("save_compressed needs a transformers model (with .config)")
    config.save_pretrained(path)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(path)
    save_model(model, os.path.join(path, WEIGHTS_NAME))
    with open(os.path.join(path, MANIFEST_NAME), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
    return path


def load_compressed(
    path: str | os.PathLike[str],
    base_config: Any | None = None,
    model_class: type | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Rebuild a model saved by :func:`save_compressed`, in eval mode.

    ``base_config`` defaults to the saved ``config.json``; ``model_class`` to the class named in
    the manifest (looked up in ``transformers``), else ``AutoModelForCausalLM``. The fresh model
    is built from the config (random init), the recorded modules are replaced by empty low-rank
    modules of the saved shapes, and the weights are loaded strictly.
    """
    import transformers
    from safetensors.torch import load_model

    path = os.fspath(path)
    with open(os.path.join(path, MANIFEST_NAME), encoding="utf-8") as fh:
        manifest = json.load(fh)
    if manifest.get("format") != _FORMAT or manifest.get("version") != _VERSION:
        raise ValueError(f"{path}: not an {_FORMAT} v{_VERSION} manifest")
    config = base_config if base_config is not None else transformers.AutoConfig.from_pretrained(path)
    if dtype is None:
        dtype = getattr(torch, manifest.get("dtype", "float32"))
    if model_class is None:
        model_class = getattr(transformers, manifest.get("model_class", ""), None)
    if model_class is None:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = model_class(config).to(dtype)
    for name, spec in manifest["modules"].items():
        model.get_submodule(name)  # clear error if the config's architecture lacks the module
        if spec["kind"] == "truncated":
            new: nn.Module = TruncatedLinear(
                spec["in_features"], spec["out_features"], spec["rank"], bias=spec["bias"], dtype=dtype
            )
        elif spec["kind"] == "lowrank":
            new = LowRankLinear(
                spec["in_features"], spec["out_features"], spec["max_rank"], bias=spec["bias"], dtype=dtype
            )
            new.active_rank = spec["active_rank"]
        else:
            raise ValueError(f"{path}: unknown module kind {spec['kind']!r} for {name}")
        _set_submodule(model, name, new)
    missing, unexpected = load_model(model, os.path.join(path, WEIGHTS_NAME), strict=True)
    if missing or unexpected:  # strict=True raises already; kept for older safetensors
        raise RuntimeError(f"{path}: missing keys {missing}, unexpected keys {unexpected}")
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.exists(gen_path) and hasattr(model, "generation_config"):
        model.generation_config = transformers.GenerationConfig.from_pretrained(path)
    return model.eval()
