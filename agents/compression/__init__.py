"""Low-rank compression with a rank that Actuator can change mid-run.

* :func:`factorize` swaps ``nn.Linear`` modules for :class:`LowRankLinear` (SVD factors, active
  rank by slicing); :func:`set_active_rank` / :class:`RankKnob` move the rank without rebuilding
  the optimizer; :func:`compression_stats` reports parameters and FLOPs in effect.
* :func:`export_truncated` turns the model into real rank-r pairs (:class:`TruncatedLinear`);
  :func:`save_compressed` / :func:`load_compressed` persist either form.
* :class:`LoraRankKnob` masks PEFT LoRA components; :class:`AdaLoraBudgetKnob` steers AdaLoRA's
  target budget.
"""

from ._io import MANIFEST_NAME, load_compressed, save_compressed
from ._knobs import AdaLoraBudgetKnob, LoraRankKnob, RankKnob
from ._lowrank import (
    DEFAULT_MLP_TARGETS,
    LowRankLinear,
    TruncatedLinear,
    active_rank,
    active_ranks,
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
    "export_truncated",
    "save_compressed",
    "load_compressed",
    "MANIFEST_NAME",
    "RankKnob",
    "LoraRankKnob",
    "AdaLoraBudgetKnob",
]
