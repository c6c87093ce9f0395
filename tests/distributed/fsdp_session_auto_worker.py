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

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)  # two ranks share two cores

import torch.distributed as dist  # noqa: E402

from actuator.agents.knobs import LearningRateKnob  # noqa: E402
from actuator.agents.session import ControlSession  # noqa: E402
from actuator.agents.sharded import RankCheckedSetter  # noqa: E402
from actuator.agents.testing import NARROW_TASK, char_tokenizer  # noqa: E402

from ranks import sharded_tiny_llama  # noqa: E402 - beside this file (the worker's folder is on sys.path)

POLICY = {"name": "fsdp2-session-auto", "controllers": [{
    "name": "hold", "probe": "custom.plant", "knob": "learning_rate", "setpoint": 1.2, "gains": "auto",
    "kp": 0.5, "ki": 0.1}]}
BATCH = 4


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    rank, model = sharded_tiny_llama()

    tok = char_tokenizer()
    enc = tok(NARROW_TASK, truncation=True, max_length=32, padding="max_length", return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    used: list[float] = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    session = ControlSession(POLICY, setters=[LearningRateKnob(optimizer)],
                             knobs={"learning_rate": {"min": 1e-5, "max": 1e-1, "max_step": 0.5}},
                             connection=a.url, run="fsdp2-session-auto")
    session.begin(model)
    window = None if session.identification is None else [session.identification.start,
                                                           session.identification.end]
    model.train()
    for step in range(1, a.steps + 1):
        rows = [(step * BATCH + i) % len(NARROW_TASK) for i in range(BATCH)]
        loss = model(input_ids=enc["input_ids"][rows], attention_mask=enc["attention_mask"][rows],
                     labels=labels[rows]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if session.sender is not None:
            session.sender.flush(10.0)
        session.step(step, model, readings={"custom.plant": 1.0} if session.main else None)
    session.finish()
    report = {
        "rank": rank,
        "sharded": session.sharded,
        "is_main": session.main,
        "window": window,
        "used": used,
        "applied": [{k: e[k] for k in ("number", "step", "knob", "applied")} for e in session.applied],
        "mismatches": sum(s.mismatches for s in session.setters.values() if isinstance(s, RankCheckedSetter)),
        "run_id": session.run_id,
    }
    Path(a.out).write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
