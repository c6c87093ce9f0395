"""One rank of the 2-process DDP test (tests/distributed/test_ddp.py).

Launched with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT in the environment: a
tiny ``transformers.Trainer`` on CPU with the gloo backend, ActuatorCallback attached to the
controller at ``--url``. Writes what this rank observed to ``--out``: the learning rate every
``optimizer.step()`` really ran with (a step pre-hook on the optimizer), the decisions this rank
applied, whether it talked to the service, and a checksum of the final weights.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).parents[1] / "agents"))  # agent_helpers

import torch  # noqa: E402

torch.set_num_threads(1)  # two ranks share two cores

import torch.distributed as dist  # noqa: E402

from actuator.agents.callback import ActuatorCallback, Reporting  # noqa: E402
from actuator.agents.probes import KLDrift  # noqa: E402

from agent_helpers import HELD_OUT, NARROW_TASK, Lockstep, lm_dataset, make_char_tokenizer  # noqa: E402
from ranks import (applied_report, ddp_trainer, drift_lr_policy, leave_group,  # noqa: E402 - beside this file
                   schedule_shape, worker_parser)

POLICY = drift_lr_policy("ddp-drift-lr")


def main() -> None:
    a = worker_parser(16).parse_args()
    rank = int(os.environ["RANK"])

    tok = make_char_tokenizer()
    trainer, used = ddp_trainer(a.out, rank, a.steps, lm_dataset(tok, NARROW_TASK), learning_rate=5e-3, warmup_steps=2)
    cb = ActuatorCallback(
        POLICY, connection=a.url, run="ddp-test",
        knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
        probes=[KLDrift(HELD_OUT, tok, every=2, max_length=32)], reporting=Reporting(budget_share=1.0),
    ).attach(trainer)
    trainer.add_callback(Lockstep(cb))  # rank 0 takes each answer at the boundary after its reading
    trainer.train()

    checksum = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    probe = cb.session.suite.probes[0]
    report = {
        "rank": rank,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "ddp": type(trainer.model_wrapped).__name__,
        "used": used,
        # the schedule's own factor per step: the knob is its peak, the lr used is peak x shape
        "shape": schedule_shape(trainer, len(used)),
        "applied": applied_report(cb.session.applied),
        "is_main": cb.session.main,
        "run_id": cb.session.run_id,
        "has_sender": cb.session.sender is not None,
        "sent": cb.session.sender.stats.sent if cb.session.sender is not None else 0,
        "observations": cb.session.seq,
        # what this rank holds for probes: a reference snapshot, a started suite clock
        "probe_reference": probe.reference_holder.snapshot is not None,
        "probe_modules": len(probe.aux_models()),
        "suite_started": cb.session.suite._t0 is not None,
        "global_step": trainer.state.global_step,
        "checksum": checksum,
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
