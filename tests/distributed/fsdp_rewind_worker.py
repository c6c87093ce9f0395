"""One rank of the 2-process FSDP2 rewind test (tests/distributed/test_fsdp2_rewind.py).

A tiny Llama ``fully_shard``-ed on a CPU gloo mesh before a real ``Trainer`` (as in fsdp_worker.py),
the Trainer saving no checkpoints of its own: the policy's ``rewind.healthy_saves`` makes the agent
save every rank's shards at healthy readings, the canary's breach rewinds both ranks to one of them
with the learning rate halved, and ``rewind.keep_best`` loads the shards of the best ``custom.score``
reading at the end. Writes what this rank saw to ``--out``.
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

from transformers import Trainer, TrainerCallback  # noqa: E402

from actuator.agents.callback import ActuatorCallback, Reporting  # noqa: E402
from actuator.agents.probes import Probe  # noqa: E402

from agent_helpers import NARROW_TASK, Canary, lm_dataset, make_char_tokenizer  # noqa: E402
from ranks import leave_group, record_lr, sharded_tiny_llama, training_args, worker_parser  # noqa: E402

BAD_FROM = 9  # the canary reads bad from this step
PEAK = 4  # custom.score is best at this step
LR = 5e-3
POLICY = {"name": "fsdp2-rewind",
          "guardrails": [{"name": "canary", "probe": "custom.canary", "bound": "upper", "threshold": 0.5,
                          "action": "rollback", "knob": "learning_rate", "factor": 0.5}],
          "rewind": {"healthy_saves": {"keep": 2, "every": 2},
                     "keep_best": {"probe": "custom.score", "mode": "max", "at_end": "load"}}}


class Score(Probe):
    name = "score"

    def __init__(self, trainer) -> None:
        self._init_schedule(1, False)
        self.trainer = trainer

    def _measure(self, model, *, max_examples=None):
        return {"custom.score": -abs(self.trainer.state.global_step - PEAK)}


def local_shards(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() for p in model.parameters()]


class Recorder(TrainerCallback):
    """The local shards at every step end (after the agent's save) and right after the rollback."""

    def __init__(self, cb: ActuatorCallback) -> None:
        self.cb = cb
        self.at: dict[int, list[torch.Tensor]] = {}
        self.after_rollback: list[torch.Tensor] | None = None

    def on_step_end(self, args, state, control, model=None, **kw):
        shards = local_shards(model)
        if self.cb.session.rollbacks and self.after_rollback is None:
            self.after_rollback = shards
        self.at[state.global_step] = shards


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def main() -> None:
    a = worker_parser(16).parse_args()
    rank, model = sharded_tiny_llama()
    tok = make_char_tokenizer()
    args = training_args(a.out, rank, a.steps, learning_rate=LR, lr_scheduler_type="constant", save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=lm_dataset(tok, NARROW_TASK))
    trainer.create_optimizer()
    used = record_lr(trainer.optimizer)
    cb = ActuatorCallback(POLICY, connection=a.url, run="fsdp2-rewind", probes=[Canary(trainer, BAD_FROM),
                                                                               Score(trainer)],
                          knobs={"learning_rate": {"min": 1e-5, "max": 1e-2}},
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    rec = Recorder(cb)
    trainer.add_callback(rec)
    trainer.train()

    rb = cb.session.rollbacks[0] if cb.session.rollbacks else None
    final = local_shards(trainer.model)
    report = {
        "rank": rank,
        "sharded": cb.session.sharded,
        "global_step": trainer.state.global_step,
        "rollbacks": cb.session.rollbacks,
        "used": used,
        "restored_equal_to_saved": rb is not None and same(rec.after_rollback, rec.at[rb["to_step"]]),
        "restored_changed": rb is not None and not same(rec.at[rb["at_step"] - 1], rec.at[rb["to_step"]]),
        "kept": getattr(cb, "kept", None),
        "final_is_peak": same(final, rec.at[PEAK]),
        "final_is_last": same(final, rec.at[trainer.state.global_step]),
        "own": sorted(os.listdir(os.path.join(args.output_dir, "actuator-rewind")))
        if os.path.isdir(os.path.join(args.output_dir, "actuator-rewind")) else [],
        "is_main": cb.session.main,
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
