"""Offline (no fine-tuning): SmolLM2-135M's held-out perplexity against its parameter count when
MLP channels are pruned under one global threshold, for three channel importances, with and
without FLAP's bias compensation. The question it answers before any training run: can width
pruning reach ≤ 85% of the dense parameters within +10% perplexity, where low rank could not?

Importance of channel j of layer l, from the inputs ``h`` of ``down_proj`` on 16 calibration blocks:

- ``wanda``: ``‖h_j‖₂ · ‖W_down[:, j]‖₂`` (what ``ChannelThresholdKnob`` uses);
- ``flap``: ``Var(h_j) · ‖W_down[:, j]‖₂²`` (FLAP's fluctuation metric);
- ``energy``: ``‖h_j‖₂² · ‖W_down[:, j]‖₂²`` (the square of ``wanda``: the same ranking).

``+bias``: FLAP's compensation, ``W_down[:, pruned] · mean(h_pruned)`` added to the MLP's output.
Every layer keeps at least 64 channels. Same data and probe as ``compress_rank``.

    python -m benchmarks.control.compress_width_offline     # writes compress-width-offline.json
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import torch

from benchmarks.control.data import blocks, stdlib_text
from benchmarks.control.harness import RESULTS, console, machine

SHARES = (0.97, 0.95, 0.92, 0.90, 0.875, 0.85, 0.80, 0.75)
MIN_CHANNELS = 64


def channel_stats(model: Any, mlps: list[Any], calib: list[Any], width: int) -> tuple[list[Any], list[Any], int]:
    """Per MLP: the sum and the sum of squares of each channel's input to down_proj over the
    calibration batches, and the number of tokens."""
    s1 = [torch.zeros(width, dtype=torch.float64) for _ in mlps]
    s2 = [torch.zeros(width, dtype=torch.float64) for _ in mlps]
    tokens = [0]

    def stats_hook(i: int):  # noqa: ANN202
        def hook(module, args):  # noqa: ANN001
            x = args[0].detach().reshape(-1, width).double()
            s1[i].add_(x.sum(0))
            s2[i].add_((x * x).sum(0))
            tokens[0] += x.shape[0] if i == 0 else 0
        return hook

    handles = [m.down_proj.register_forward_pre_hook(stats_hook(i)) for i, m in enumerate(mlps)]
    with torch.no_grad():
        for b in calib:
            model(b)
    for h in handles:
        h.remove()
    return s1, s2, tokens[0]


class Pruning:
    """Channel masks on every MLP's down_proj input, with an optional bias compensation (the mean
    of the pruned channels' contribution)."""

    def __init__(self, mlps: list[Any], width: int, hidden: int) -> None:
        self.mlps = mlps
        self.masks = [torch.ones(width) for _ in mlps]
        self.comp = [torch.zeros(hidden) for _ in mlps]
        self.use_comp = False
        for i, m in enumerate(mlps):
            m.down_proj.register_forward_pre_hook(self._mask_hook(i))
            m.down_proj.register_forward_hook(self._comp_hook(i))

    def _mask_hook(self, i: int):  # noqa: ANN202
        return lambda module, args: (args[0] * self.masks[i],)

    def _comp_hook(self, i: int):  # noqa: ANN202
        return lambda module, args, out: out + self.comp[i] if self.use_comp else out

    def cut(self, scores: list[Any], tau: float, mean: list[Any], bias: bool) -> None:
        """Keep the channels scoring above ``tau`` (at least ``MIN_CHANNELS`` a layer)."""
        for i, mlp in enumerate(self.mlps):
            keep = scores[i].log() > tau
            if keep.sum() < MIN_CHANNELS:
                keep[torch.topk(scores[i], MIN_CHANNELS).indices] = True
            self.masks[i] = keep.float()
            self.comp[i] = (mlp.down_proj.weight.detach().double() @ ((1 - keep.double()) * mean[i])).float()
        self.use_comp = bias


def curve(kind: str, bias: bool, scores: list[Any], mean: list[Any], pruning: Pruning, probe: Any, model: Any,
          dense: float, dense_params: int, per_channel: int, width: int) -> list[dict[str, Any]]:
    """Perplexity against the kept share of parameters, one point per ``SHARES``."""
    ordered = torch.sort(torch.cat(scores).log()).values
    points = []
    for share in SHARES:
        cut = int(math.ceil((dense_params - share * dense_params) / per_channel))
        pruning.cut(scores, ordered[cut - 1].item(), mean, bias)
        params = dense_params - (len(pruning.mlps) * width - sum(int(m.sum()) for m in pruning.masks)) * per_channel
        ppl = probe.measure(model, step=0)["perplexity"]
        widths = [int(m.sum()) for m in pruning.masks]
        points.append({"share": params / dense_params, "perplexity": ppl, "rise_pct": 100 * (ppl / dense - 1),
                       "width_min": min(widths), "width_max": max(widths)})
        console.print(f"{kind}{' +bias' if bias else ''} {params / dense_params:.3f}: ppl {ppl:.2f} "
                      f"({100 * (ppl / dense - 1):+.1f}%), widths {min(widths)}-{max(widths)}")
    return points


def main() -> dict:
    from actuator.agents.models import load_smollm2
    from actuator.agents.probes import Perplexity

    torch.set_num_threads(1)
    model, tok = load_smollm2()
    model.eval()
    data = blocks(tok, stdlib_text(), 64)
    probe = Perplexity([tok.decode(b) for b in data[:8]], tok, every=None, max_length=72, batch_size=8)
    calib = [torch.stack(data[8:][i:i + 4]) for i in range(0, 16, 4)]
    dense_params = sum(p.numel() for p in model.parameters())
    t0 = time.time()
    dense = probe.measure(model, step=0)["perplexity"]
    mlps = [layer.mlp for layer in model.model.layers]
    width, hidden = mlps[0].down_proj.in_features, mlps[0].down_proj.out_features
    s1, s2, n = channel_stats(model, mlps, calib, width)
    col = [m.down_proj.weight.detach().double().pow(2).sum(0) for m in mlps]
    mean = [s / n for s in s1]
    var = [s2[i] / n - mean[i] ** 2 for i in range(len(mlps))]
    scores = {"wanda": [s2[i].sqrt() * col[i].sqrt() for i in range(len(mlps))],
              "flap": [var[i] * col[i] for i in range(len(mlps))],
              "energy": [s2[i] * col[i] for i in range(len(mlps))]}
    pruning = Pruning(mlps, width, hidden)
    per_channel = 3 * hidden
    out: dict = {"dense_perplexity": dense, "dense_params": dense_params, "min_channels": MIN_CHANNELS,
                 "curves": {}, "machine": machine()}
    for kind in ("wanda", "flap", "energy"):
        for bias in ((False, True) if kind == "flap" else (False,)):
            out["curves"][kind + ("+bias" if bias else "")] = curve(
                kind, bias, scores[kind], mean, pruning, probe, model, dense, dense_params, per_channel, width)
    out["seconds"] = time.time() - t0
    (RESULTS / "compress-width-offline.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
