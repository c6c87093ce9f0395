"""One rank of the 2-process FSDP2 gains-auto test of ``ControlSession`` (tests/distributed/
test_fsdp2_session_auto.py).

A tiny Llama ``fully_shard``-ed on a CPU mesh over gloo, trained by a plain loop under a sharded
``ControlSession`` whose policy has a ``gains: auto`` controller on the learning rate. The service
at ``--url`` does not take the warm-up step test (one that predates gains auto): rank 0 hears so
at its registration and cancels the test; the other rank hears nothing from the service. Rank 0
reports a constant reading of the controller's probe (``readings=``) at every step. Writes the
learning rate every ``optimizer.step()`` of this rank ran with, and what the session planned.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)  # two ranks share two cores

from actuator.agents.knobs import LearningRateKnob  # noqa: E402
from actuator.agents.session import ControlSession  # noqa: E402
from actuator.agents.testing import char_tokenizer  # noqa: E402

from ranks import (applied_report, leave_group, mismatches, record_lr,  # noqa: E402 - beside this file
                   sharded_tiny_llama, train_under_session, worker_parser)

POLICY = {"name": "fsdp2-session-auto", "controllers": [{
    "name": "hold", "probe": "custom.plant", "knob": "learning_rate", "setpoint": 1.6, "gains": "auto",
    "kp": 0.5, "ki": 0.1}]}


def main() -> None:
    a = worker_parser(8).parse_args()
    rank, model = sharded_tiny_llama()

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    used = record_lr(optimizer)
    session = ControlSession(POLICY, setters=[LearningRateKnob(optimizer)],
                             knobs={"learning_rate": {"min": 1e-5, "max": 1e-1, "max_step": 0.5}},
                             connection=a.url, run="fsdp2-session-auto")
    session.begin(model)
    window = None if session.identification is None else [session.identification.start,
                                                           session.identification.end]
    train_under_session(session, model, optimizer, char_tokenizer(), a.steps,
                        readings={"custom.plant": 1.0} if session.main else None)
    session.finish()
    report = {
        "rank": rank,
        "sharded": session.sharded,
        "is_main": session.main,
        "window": window,
        "used": used,
        "applied": applied_report(session.applied),
        "mismatches": mismatches(session.setters),
        "run_id": session.run_id,
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
