"""One rank of the 2-process FSDP2 test (tests/distributed/test_fsdp2.py).

A tiny Llama is ``fully_shard``-ed (each decoder layer, then the root) on a CPU device mesh over
gloo, *before* a real ``transformers.Trainer`` gets it: accelerate 1.15 never enables its FSDP path
with ``use_cpu=True`` (``_hf_compat.sharding_unsupported``), so the process group is made here and
the Trainer sees one process (``DistributedType.NO``: it neither wraps the model in DDP nor splits
the data, so both ranks train on the same batches and FSDP2 reduce-scatters the gradients).
``ShardedTrainer`` only keeps the Trainer from writing ``model.safetensors`` from DTensors (which
safetensors cannot); the weights of a checkpoint are the callback's DCP shards.

On the run: ActuatorCallback with a KL-drift controller on the learning rate, a canary guardrail
that orders one rollback, a KL anchor on the loss, and drift, perplexity and canary probes. Writes
what this rank saw to ``--out``.
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
from transformers import Trainer, TrainerCallback  # noqa: E402

from actuator.agents.anchor import KLAnchor, install_anchor  # noqa: E402
from actuator.agents.callback import ActuatorCallback, Reporting  # noqa: E402
from actuator.agents.probes import KLDrift, Perplexity  # noqa: E402
from actuator.agents.sharded import local_and_full_numel  # noqa: E402

from agent_helpers import HELD_OUT, NARROW_TASK, Canary, lm_dataset, make_char_tokenizer  # noqa: E402
from ranks import (control_report, drift_lr_policy, leave_group, record_lr,  # noqa: E402 - beside this file
                   sharded_tiny_llama, single_process_probes, training_args, worker_parser)

BAD_FROM = 8  # the canary reads bad from this step: one rollback to a checkpoint before it
POLICY = drift_lr_policy("fsdp2-drift-lr", guardrails=[
    {"name": "canary", "probe": "custom.canary", "bound": "upper", "threshold": 0.5, "action": "rollback"}])


class ShardedTrainer(Trainer):
    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        os.makedirs(output_dir or self.args.output_dir, exist_ok=True)  # weights: the callback's DCP shards


def local_shards(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() for p in model.parameters()]


class Recorder(TrainerCallback):
    """The local shards at every save and right after the rollback (it runs after ActuatorCallback)."""

    def __init__(self, cb: ActuatorCallback) -> None:
        self.cb, self.saved, self.after_rollback, self.before_rollback = cb, {}, None, None
        self.last: list[torch.Tensor] | None = None

    def on_save(self, args, state, control, model=None, **kw):
        self.saved[state.global_step] = local_shards(model)

    def on_step_end(self, args, state, control, model=None, **kw):
        if self.cb.session.rollbacks and self.after_rollback is None:
            self.after_rollback = local_shards(model)
            self.before_rollback = self.last  # the weights the step before: what the rollback replaced
        self.last = local_shards(model)


def main() -> None:
    a = worker_parser(14).parse_args()
    rank, model = sharded_tiny_llama()

    tok = make_char_tokenizer()
    args = training_args(a.out, rank, a.steps, learning_rate=5e-3, lr_scheduler_type="constant",
                         save_strategy="steps", save_steps=3)
    trainer = ShardedTrainer(model=model, args=args, train_dataset=lm_dataset(tok, NARROW_TASK))
    anchor = KLAnchor(HELD_OUT, tok, weight=0.5, max_length=32, batch_size=2)
    install_anchor(trainer, anchor)
    trainer.create_optimizer()
    used = record_lr(trainer.optimizer)
    probes = [Canary(trainer, bad_from=BAD_FROM), KLDrift(HELD_OUT, tok, every=2, max_length=32),
              Perplexity(HELD_OUT, tok, every=4, max_length=32)]
    cb = ActuatorCallback(POLICY, connection=a.url, run="fsdp2-test", probes=probes,
                          knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    rec = Recorder(cb)
    trainer.add_callback(rec)
    trainer.train()

    # A final reading on every rank at once (the suite's lockstep), then the same probes on the
    # gathered full weights in this process alone, unsharded: the single-process reference.
    final = cb.session.suite.run(trainer.model, trainer.state.global_step, force=True).values
    single = single_process_probes(trainer.model, tok)

    drift = next(p for p in cb.session.suite.probes if p.name == "kl_drift")
    reference = drift.reference_holder.snapshot
    rb = cb.session.rollbacks[0] if cb.session.rollbacks else None
    restored = None
    if rb is not None and rec.after_rollback is not None:
        want = rec.saved[rb["to_step"]]
        restored = {
            "equal_to_saved": all(torch.equal(x, y) for x, y in zip(rec.after_rollback, want)),
            "changed": any(not torch.equal(x, y) for x, y in zip(rec.before_rollback, want)),
        }
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "distributed_type": str(trainer.accelerator.distributed_type),
        "wrapped": type(trainer.model_wrapped).__name__,
        "model_numel": local_and_full_numel(trainer.model),
        "reference_numel": local_and_full_numel(reference) if reference is not None else None,
        "anchor": {"forwards": anchor.forwards, "last_kl": anchor.last_kl, "last_weight": anchor.last_weight,
                   "holds_reference": anchor.reference is not None},
        "used": used,
        **control_report(cb, trainer, rank, final, single, restored),
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
