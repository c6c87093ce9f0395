"""One rank of the 2-process preset test (tests/distributed/test_ddp_preset_warnings.py).

A tiny ``transformers.Trainer`` under CPU DDP (gloo) with ``ActuatorCallback("preset:sft-capability")``
and no probes passed: rank 0 builds the preset's probes from shipped data and measures them; the
other rank has none. ``--budget`` is the probes' share of wall time (small: the preset's probes are
skipped for budget after their baseline, and rank 0 says so). Writes this rank's report to ``--out``
(its log is the launcher's rank log)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)  # two ranks share two cores

from transformers import Trainer  # noqa: E402

from actuator.agents.callback import ActuatorCallback, Reporting  # noqa: E402
from actuator.agents.models import tiny_llama  # noqa: E402
from actuator.agents.testing import NARROW_TASK, char_tokenizer, lm_dataset  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from ranks import leave_group, training_args, worker_parser  # noqa: E402


def main() -> None:
    ap = worker_parser(8)
    ap.add_argument("--budget", type=float, default=0.001)
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    rank = int(os.environ["RANK"])
    tok = char_tokenizer()
    args = training_args(a.out, rank, a.steps, learning_rate=5e-3, lr_scheduler_type="constant", save_strategy="no",
                         ddp_backend="gloo", ddp_find_unused_parameters=False)
    trainer = Trainer(model=tiny_llama(seed=0), args=args, train_dataset=lm_dataset(tok, NARROW_TASK),
                      processing_class=tok)
    cb = ActuatorCallback("preset:sft-capability", connection=a.url, run="ddp-preset",
                          reporting=Reporting(budget_share=a.budget)).attach(trainer)
    trainer.train()
    report = {
        "rank": rank, "is_main": cb.session.main, "run_id": cb.session.run_id,
        "probes": sorted(p.name for p in cb.session.suite.probes) if cb.session.suite is not None else [],
        "history": cb.session.history,
        "global_step": trainer.state.global_step,
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
