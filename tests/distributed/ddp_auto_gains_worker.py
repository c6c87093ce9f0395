"""One rank of the 2-process gains-auto test (tests/distributed/test_ddp_auto_gains.py).

Launched like ddp_worker.py (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT): a tiny
``transformers.Trainer`` under DDP on CPU (gloo), with ``ActuatorCallback`` given a policy **by
name**, stored on the service beforehand, whose controller on the learning rate has ``gains:
auto``. Only rank 0 fetches the policy, so only rank 0 knows there is a step test to run; the
callback shares rank 0's plan. Writes the learning rate every ``optimizer.step()`` of this rank
really ran with, the schedule's own factor per step, and the decisions this rank applied.

The probe is tests/agents/test_auto_gains.py's known plant (rank 0 probes; the others never run
it): a first-order response to ln(the schedule's peak), computed in the probe.
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

from agent_helpers import NARROW_TASK, SlowSteps, lm_dataset, make_char_tokenizer  # noqa: E402
from ranks import (applied_report, ddp_trainer, leave_group, schedule_shape,  # noqa: E402 - beside this file
                   worker_parser)
from test_auto_gains import GAIN, LR, Plant  # noqa: E402 - the known plant of the single-process tests


def main() -> None:
    ap = worker_parser(24)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--pause", type=float, default=0.05, help="seconds slept after each step")
    a = ap.parse_args()
    rank = int(os.environ["RANK"])

    tok = make_char_tokenizer()
    trainer, used = ddp_trainer(a.out, rank, a.steps, lm_dataset(tok, NARROW_TASK), learning_rate=LR,
                                warmup_steps=a.warmup)
    cb = ActuatorCallback(
        a.policy, connection=a.url, run="ddp-auto-gains",
        knobs={"learning_rate": {"min": 1e-5, "max": 1e-1, "max_step": 0.5}},
        probes=[Plant(trainer, GAIN)], reporting=Reporting(budget_share=1.0),
    ).attach(trainer)
    trainer.add_callback(SlowSteps(a.pause))
    trainer.train()

    ident = cb.session.identification
    report = {
        "rank": rank,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "ddp": type(trainer.model_wrapped).__name__,
        "knows_policy": cb.session.policy_doc is not None,
        "used": used,
        "shape": schedule_shape(trainer, len(used)),
        "applied": applied_report(cb.session.applied),
        "window": None if ident is None else [ident.start, ident.end],
        "run_id": cb.session.run_id,
        "global_step": trainer.state.global_step,
        "checksum": float(sum(p.detach().double().sum() for p in trainer.model.parameters())),
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
