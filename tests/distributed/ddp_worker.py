"""One rank of the 2-process DDP test (tests/distributed/test_ddp.py).

Launched with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT in the environment: a
tiny ``transformers.Trainer`` on CPU with the gloo backend, ActuatorCallback attached to the
controller at ``--url``. Writes what this rank observed to ``--out``: the learning rate every
``optimizer.step()`` really ran with (a step pre-hook on the optimizer), the decisions this rank
applied, whether it talked to the service, and a checksum of the final weights.
"""

from __future__ import annotations

import argparse
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
from transformers import Trainer, TrainingArguments  # noqa: E402

from actuator.agents.callback import ActuatorCallback, Reporting  # noqa: E402
from actuator.agents.models import tiny_llama  # noqa: E402
from actuator.agents.probes import KLDrift  # noqa: E402

from agent_helpers import HELD_OUT, NARROW_TASK, SlowSteps, lm_dataset, make_char_tokenizer  # noqa: E402

POLICY = {
    "name": "ddp-drift-lr",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.0,
                     "kp": 5.0, "ki": 1.0}],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=16)
    a = ap.parse_args()
    rank = int(os.environ["RANK"])

    tok = make_char_tokenizer()
    args = TrainingArguments(
        output_dir=str(Path(a.out).parent / f"out-{rank}"), max_steps=a.steps, per_device_train_batch_size=4,
        learning_rate=5e-3, lr_scheduler_type="linear", warmup_steps=2, logging_steps=1, save_strategy="no",
        report_to=[], seed=0, dataloader_num_workers=0, disable_tqdm=True,
        # CPU DDP: with use_cpu=True and WORLD_SIZE > 1, accelerate's PartialState picks
        # DistributedType.MULTI_CPU; ddp_backend="gloo" names the backend (accelerate/state.py).
        use_cpu=True, ddp_backend="gloo", ddp_find_unused_parameters=False,
    )
    trainer = Trainer(model=tiny_llama(seed=0), args=args, train_dataset=lm_dataset(tok, NARROW_TASK))
    used: list[float] = []
    trainer.create_optimizer()
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    cb = ActuatorCallback(
        POLICY, connection=a.url, run="ddp-test",
        knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
        probes=[KLDrift(HELD_OUT, tok, every=2, max_length=32)], reporting=Reporting(budget_share=1.0),
    ).attach(trainer)
    trainer.add_callback(SlowSteps(0.05))
    trainer.train()

    checksum = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
    probe = cb.suite.probes[0]
    report = {
        "rank": rank,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "ddp": type(trainer.model_wrapped).__name__,
        "used": used,
        # the schedule's own factor per step: the knob is its peak, the lr used is peak x shape
        "shape": [float(trainer.lr_scheduler.lr_lambdas[0](k)) for k in range(len(used) + 1)],
        "applied": [{k: e[k] for k in ("number", "step", "knob", "applied")} for e in cb.applied],
        "is_main": cb._is_main,
        "run_id": cb.run_id,
        "has_sender": cb.sender is not None,
        "sent": cb.sender.stats.sent if cb.sender is not None else 0,
        "observations": cb.seq,
        # what this rank holds for probes: a reference snapshot, a started suite clock
        "probe_reference": probe.reference_holder.snapshot is not None,
        "probe_modules": len(probe.aux_models()),
        "suite_started": cb.suite._t0 is not None,
        "global_step": trainer.state.global_step,
        "checksum": checksum,
    }
    Path(a.out).write_text(json.dumps(report))
    if dist.is_initialized():
        # Tear the gloo group down before the interpreter exits: left to process exit, its C++
        # threads were sometimes destroyed while joinable ("terminate called without an active
        # exception", SIGABRT, exit -6) on a loaded machine.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
