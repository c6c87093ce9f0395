"""A tiny Trainer under ActuatorCallback, as a launcher starts it (tests/distributed/test_launch_warnings.py):
``accelerate launch`` sets the environment, the Trainer forms the process group (gloo on CPU) when
it launched more than one. Writes this process's rank and world size to ``--out``-<rank>."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from transformers import Trainer  # noqa: E402

from actuator.agents.callback import ActuatorCallback  # noqa: E402
from actuator.agents.models import tiny_llama  # noqa: E402
from actuator.agents.sharded import rank_and_world  # noqa: E402
from actuator.agents.testing import NARROW_TASK, char_tokenizer, lm_dataset  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from ranks import leave_group, training_args, worker_parser  # noqa: E402


def main() -> None:
    a = worker_parser(2).parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    tok = char_tokenizer()
    args = training_args(a.out, int(os.environ.get("RANK", 0)), a.steps, save_strategy="no")
    trainer = Trainer(model=tiny_llama(seed=0), args=args, train_dataset=lm_dataset(tok, NARROW_TASK))
    policy = {"name": "launch", "guardrails": [{"name": "loss-cap", "probe": "custom.never", "bound": "upper",
                                                "threshold": 1.0, "action": "alert"}]}
    ActuatorCallback(policy, connection=a.url, run="launch").attach(trainer)
    trainer.train()
    rank, world = rank_and_world()
    Path(f"{a.out}-{rank}").write_text(json.dumps({"rank": rank, "world": world}))
    leave_group()


if __name__ == "__main__":
    main()
