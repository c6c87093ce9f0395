"""One rank of the 2-process DDP custom-loop test (tests/distributed/test_ddp_session.py).

A tiny Llama wrapped in ``DistributedDataParallel`` (gloo, CPU) is trained by a plain PyTorch loop
under a ``ControlSession``, the session driven on every rank alike (``begin``, ``step``,
``finish``): the one rule for collectives, as under FSDP2 and the Trainer callback. Under DDP rank
0 probes alone on its full replica (the inner module, outside the DDP wrapper). Writes what this
rank saw to ``--out``.

Rank 0 lets its sender deliver what it has before each step boundary (``sender.flush``), so the
decisions come back within the run's few steps whatever the machine's load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

torch.set_num_threads(1)  # two ranks share two cores

import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from actuator.agents.knobs import LearningRateKnob  # noqa: E402
from actuator.agents.models import tiny_llama  # noqa: E402
from actuator.agents.probes import KLDrift  # noqa: E402
from actuator.agents.session import ControlSession, Reporting  # noqa: E402
from actuator.agents.sharded import RankCheckedSetter  # noqa: E402
from actuator.agents.testing import HELD_OUT, NARROW_TASK, char_tokenizer  # noqa: E402

from ranks import applied_report, drift_lr_policy, leave_group, mismatches, record_lr, worker_parser  # noqa: E402

POLICY = drift_lr_policy("ddp-session-drift-lr")


def main() -> None:
    a = worker_parser(12).parse_args()
    rank, port = int(os.environ["DDP_TEST_RANK"]), int(os.environ["DDP_TEST_PORT"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = tiny_llama(seed=0)
    ddp = DistributedDataParallel(model)
    tok = char_tokenizer()
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=5e-3)
    used = record_lr(optimizer)
    session = ControlSession(POLICY, setters=[LearningRateKnob(optimizer)],
                             knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
                             probes=[KLDrift(HELD_OUT, tok, every=2, max_length=32)],
                             connection=a.url, run="ddp-session-test", reporting=Reporting(budget_share=1.0))
    session.begin(model, max_steps=a.steps)  # every rank: rank 0 registers and probes, the others follow

    enc = tok(NARROW_TASK, truncation=True, max_length=32, padding="max_length", return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    ddp.train()
    for step in range(1, a.steps + 1):
        rows = [(step * 8 + rank * 4 + i) % len(NARROW_TASK) for i in range(4)]  # each rank its own rows
        loss = ddp(input_ids=enc["input_ids"][rows], attention_mask=enc["attention_mask"][rows],
                   labels=labels[rows]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if session.sender is not None:
            session.sender.flush(10.0)
        session.step(step, model, metrics={"loss": loss.item()})
    delivered = session.finish()

    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "sharded": session.sharded,
        "is_main": session.main,
        "run_id": session.run_id,
        "used": used,
        "applied": applied_report(session.applied),
        "checked": all(isinstance(s, RankCheckedSetter) for s in session.setters.values()),
        "mismatches": mismatches(session.setters),
        "knob_values": session.knob_values(),
        "observations": session.seq,
        "history": session.history,
        "phases": [name for name, _ in getattr(session, "phases", [])],
        "delivered": delivered,
        "checksum": float(sum(p.detach().double().sum() for p in model.parameters())),
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
