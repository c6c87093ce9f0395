"""One rank of the 2-process DeepSpeed test (tests/distributed/test_deepspeed.py).

Launched like ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT in the
environment, ``DS_ACCELERATOR=cpu``): a real ``transformers.Trainer`` of the seed tiny Llama under
DeepSpeed ZeRO ``--stage`` (2 or 3) over gloo, ``TrainingArguments(use_cpu=True, deepspeed=cfg)``, the
process group made by ``deepspeed.init_distributed(dist_backend="gloo")`` first (ZeRO-3 needs it
before ``TrainingArguments``). Both ranks write their checkpoints to one output directory (what a
shared filesystem gives a real run: DeepSpeed writes every rank's partitions, rank 0 the rest).

On the run: ActuatorCallback with a KL-drift controller on the learning rate, a canary guardrail
that orders one rollback, a KL anchor on the loss (its ``kl_weight`` knob bound), and drift,
perplexity and canary probes. After it: a final probe reading in lockstep, the same probes in one
process on the gathered full weights, the anchor's weight set through the knob on every rank and
the loss it moves, and a resume from the last checkpoint with a new Trainer and callback.
Writes what this rank saw to ``--out``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).parents[1] / "agents"))  # agent_helpers

import torch  # noqa: E402

torch.set_num_threads(1)  # two ranks share two cores

import deepspeed  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import Trainer, TrainerCallback  # noqa: E402

from actuator.agents.anchor import KLAnchor, install_anchor  # noqa: E402
from actuator.agents.callback import ActuatorCallback, Reporting  # noqa: E402
from actuator.agents.models import tiny_llama  # noqa: E402
from actuator.agents.probes import KLDrift, Perplexity  # noqa: E402
from actuator.agents.sharded import local_and_full_numel  # noqa: E402

from agent_helpers import HELD_OUT, NARROW_TASK, Canary, lm_dataset, make_char_tokenizer  # noqa: E402
from ranks import (control_report, drift_lr_policy, leave_group, mismatches,  # noqa: E402 - beside this file
                   probes_on_full_weights, training_args, worker_parser)

BAD_FROM = 8  # the canary reads bad from this step: one rollback to a checkpoint before it
RESUME_STEPS = 3  # the resumed run trains this many steps past the last checkpoint
POLICY = drift_lr_policy("deepspeed-drift-lr", guardrails=[
    {"name": "canary", "probe": "custom.canary", "bound": "upper", "threshold": 0.5, "action": "rollback"}])
KNOBS = {"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}, "kl_weight": {"min": 0.0, "max": 2.0}}


def ds_config(stage: int) -> dict:
    return {"zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto"}


def local_shards(model: torch.nn.Module) -> list[torch.Tensor]:
    """What this rank holds of each parameter: its ZeRO-3 partition, or the whole replica (ZeRO-2)."""
    return [(p.ds_tensor if hasattr(p, "ds_tensor") else p).detach().clone() for p in model.parameters()]


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full weights on every rank (a collective under ZeRO-3: every rank takes part)."""
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def innermost(optimizer):
    """The torch optimizer DeepSpeed really steps (under accelerate's and ZeRO's wrappers)."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


class Recorder(TrainerCallback):
    """The lr each optimizer step really ran with (a pre-hook on the torch optimizer DeepSpeed
    steps; ZeRO-3 steps it once per sub-group, so a set per step), this rank's shards at every save
    and around the rollback (it runs after ActuatorCallback), and the shards at train begin."""

    def __init__(self, cb: ActuatorCallback, trainer: Trainer) -> None:
        self.cb, self.trainer = cb, trainer
        self.used: dict[int, set[float]] = {}
        self.saved: dict[int, list[torch.Tensor]] = {}
        self.after_rollback = self.before_rollback = self.last = self.at_begin = None
        self.step = 0

    def on_train_begin(self, args, state, control, model=None, **kw):
        self.at_begin = local_shards(model)
        self.inner_type = type(innermost(self.trainer.optimizer)).__name__
        innermost(self.trainer.optimizer).register_step_pre_hook(
            lambda opt, a, k: self.used.setdefault(self.step, set()).add(opt.param_groups[0]["lr"]))

    def on_step_begin(self, args, state, control, **kw):
        self.step = state.global_step + 1

    def on_save(self, args, state, control, model=None, **kw):
        self.saved[state.global_step] = local_shards(model)

    def on_step_end(self, args, state, control, model=None, **kw):
        if self.cb.session.rollbacks and self.after_rollback is None:
            self.after_rollback = local_shards(model)
            self.before_rollback = self.last
        self.last = local_shards(model)

    def lr_by_step(self) -> dict[str, list[float]]:
        return {str(k): sorted(v) for k, v in sorted(self.used.items())}


def build(a, rank: int, tok, steps: int):
    args = training_args(a.out, rank, steps, output_dir=str(Path(a.out).parent / "out"), learning_rate=5e-3,
                         lr_scheduler_type="constant", save_strategy="steps", save_steps=3,
                         deepspeed=ds_config(a.stage))
    trainer = Trainer(model=tiny_llama(seed=0), args=args, train_dataset=lm_dataset(tok, NARROW_TASK))
    anchor = KLAnchor(HELD_OUT, tok, weight=0.5, max_length=32, batch_size=2)
    install_anchor(trainer, anchor)
    probes = [Canary(trainer, bad_from=BAD_FROM), KLDrift(HELD_OUT, tok, every=2, max_length=32),
              Perplexity(HELD_OUT, tok, every=4, max_length=32)]
    cb = ActuatorCallback(POLICY, connection=a.url, run=f"deepspeed-zero{a.stage}", probes=probes, knobs=KNOBS,
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    rec = Recorder(cb, trainer)
    trainer.add_callback(rec)
    return trainer, anchor, cb, rec


def anchor_moves_loss(trainer: Trainer, anchor: KLAnchor, cb: ActuatorCallback, tok) -> dict:
    """The same batch's training loss with the anchor's weight set to 0 and to 1.5 through the
    ``kl_weight`` knob (on every rank: under ZeRO-3 each forward is a collective), the anchor
    drawing the same texts both times."""
    enc = tok(NARROW_TASK[:4], truncation=True, max_length=32, padding="max_length", return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
              "labels": enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)}
    rng = anchor._rng.getstate()
    out = {}
    trainer.model.train()
    for w in (0.0, 1.5):
        out[f"applied_{w}"] = cb.session.setters["kl_weight"].apply(w)
        anchor._rng.setstate(rng)
        with torch.no_grad():
            out[f"loss_{w}"] = float(trainer.compute_loss(trainer.model, dict(inputs)))
        out[f"kl_{w}"] = anchor.last_kl
    return out


def main() -> None:
    ap = worker_parser(14)
    ap.add_argument("--stage", type=int, required=True)
    a = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")  # before TrainingArguments (ZeRO-3 needs it)
    rank = dist.get_rank()
    tok = make_char_tokenizer()

    trainer, anchor, cb, rec = build(a, rank, tok, a.steps)
    trainer.train()

    model = trainer.model
    final = cb.session.suite.run(model, trainer.state.global_step, force=True).values  # in lockstep, every rank
    full = full_state(model)  # every rank takes part; rank 0 measures
    single = probes_on_full_weights(full, tok) if rank == 0 else {}
    drift = next(p for p in cb.session.suite.probes if p.name == "kl_drift")
    reference = drift.reference_holder.snapshot
    moved = anchor_moves_loss(trainer, anchor, cb, tok)
    rb = cb.session.rollbacks[0] if cb.session.rollbacks else None
    restored = None
    if rb is not None and rec.after_rollback is not None:
        want = rec.saved[rb["to_step"]]
        restored = {"equal_to_saved": all(torch.equal(x, y) for x, y in zip(rec.after_rollback, want)),
                    "changed": any(not torch.equal(x, y) for x, y in zip(rec.before_rollback, want))}
    last_ckpt = max(rec.saved)
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "engine": type(trainer.model_wrapped).__name__,
        "zero_stage": trainer.model_wrapped.zero_optimization_stage(),
        "inner_optimizer": rec.inner_type,
        "sharded": cb.session.sharded,
        "model_numel": local_and_full_numel(model),
        "reference_numel": local_and_full_numel(reference) if reference is not None else None,
        "anchor": {"forwards": anchor.forwards, "last_kl": anchor.last_kl, "moved": moved},
        "lr": rec.lr_by_step(),
        "last_checkpoint": last_ckpt,
        **control_report(cb, trainer, rank, final, single, restored),
    }

    # Resume: a new Trainer and callback (as a restarted script builds them) continue from the last
    # checkpoint; DeepSpeed loads every rank's partitions, the callback continues the same run.
    ckpt = str(Path(trainer.args.output_dir) / f"checkpoint-{last_ckpt}")
    saved = rec.saved[last_ckpt]
    trainer2, _, cb2, rec2 = build(a, rank, tok, last_ckpt + RESUME_STEPS)
    trainer2.train(resume_from_checkpoint=ckpt)
    report["resume"] = {
        "run_id": cb2.session.run_id,
        "loaded_equal_to_saved": all(torch.equal(x, y) for x, y in zip(rec2.at_begin, saved)),
        "global_step": trainer2.state.global_step,
        "lr": rec2.lr_by_step(),
        "observations": cb2.session.seq,
        "mismatches": mismatches(cb2.session.setters),
        "knob_values": cb2.session.knob_values(),
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
