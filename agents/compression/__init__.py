"""Low-rank compression with a rank that Actuator can change mid-run.

* :func:`factorize` swaps ``nn.Linear`` modules for :class:`LowRankLinear` (SVD factors, active
  rank by slicing); :func:`set_active_rank` / :class:`RankKnob` move one rank for every layer
  without rebuilding the optimizer; :class:`ThresholdKnob` (``compression_threshold``) sets each
  layer's rank from one threshold on its components' sensitivities
  (:func:`component_sensitivities`); :func:`compression_stats` reports parameters and FLOPs.
* :class:`ChannelThresholdKnob` (``mlp_channel_threshold``) prunes MLP channels (structured
  width) under one threshold on their activation-weighted importance, by masking.
* :func:`export_pretrained` writes a model that plain ``transformers`` loads (factors where they
  are smaller, dense weights elsewhere, masked MLP channels sliced out).
* :func:`export_truncated` turns the model into real rank-r pairs (:class:`TruncatedLinear`);
  :func:`save_compressed` / :func:`load_compressed` persist either form.
* :class:`LoraRankKnob` masks PEFT LoRA components; :class:`AdaLoraBudgetKnob` steers AdaLoRA's
  target budget.
"""

from ._io import MANIFEST_NAME, load_compressed, save_compressed
from ._export import export_pretrained
from ._knobs import AdaLoraBudgetKnob, LoraRankKnob, RankKnob
from ._threshold import ThresholdKnob
from ._width import ChannelThresholdKnob, channel_masks, gated_mlps
from ._lowrank import (
    DEFAULT_MLP_TARGETS,
    LowRankLinear,
    TruncatedLinear,
    active_rank,
    active_ranks,
    break_even_rank,
    component_sensitivities,
    compression_stats,
    export_truncated,
    factorize,
    input_grams,
    lowrank_layers,
    set_active_rank,
)

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
    "break_even_rank",
    "component_sensitivities",
    "export_truncated",
    "export_pretrained",
    "save_compressed",
    "load_compressed",
    "MANIFEST_NAME",
    "RankKnob",
    "ThresholdKnob",
    "ChannelThresholdKnob",
    "channel_masks",
    "gated_mlps",
    "LoraRankKnob",
    "AdaLoraBudgetKnob",
]
