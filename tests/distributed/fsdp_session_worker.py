"""One rank of the 2-process FSDP2 custom-loop test (tests/distributed/test_fsdp2_session.py).

A tiny Llama is ``fully_shard``-ed (each decoder layer, then the root) on a CPU device mesh over
gloo and trained by a plain PyTorch loop (AdamW, no Trainer, no accelerate) under a
``ControlSession``: every rank calls ``begin`` and ``step`` alike, with the same probes (KL drift,
perplexity) and a KL-drift controller on the learning rate. Both ranks train on the same batches
(FSDP2 reduce-scatters the gradients). Writes what this rank saw to ``--out``.

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

from actuator.agents.knobs import LearningRateKnob  # noqa: E402
from actuator.agents.probes import KLDrift, Perplexity  # noqa: E402
from actuator.agents.session import ControlSession, Reporting  # noqa: E402
from actuator.agents.sharded import RankCheckedSetter, local_and_full_numel  # noqa: E402
from actuator.agents.testing import HELD_OUT, char_tokenizer  # noqa: E402

from ranks import (applied_report, drift_lr_policy, leave_group, mismatches,  # noqa: E402 - beside this file
                   record_lr, sharded_tiny_llama, single_process_probes, train_under_session, worker_parser)

POLICY = drift_lr_policy("fsdp2-session-drift-lr")


def main() -> None:
    a = worker_parser(12).parse_args()
    rank, model = sharded_tiny_llama()

    tok = char_tokenizer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    used = record_lr(optimizer)
    session = ControlSession(POLICY, setters=[LearningRateKnob(optimizer)],
                             knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
                             probes=[KLDrift(HELD_OUT, tok, every=2, max_length=32),
                                     Perplexity(HELD_OUT, tok, every=4, max_length=32)],
                             connection=a.url, run="fsdp2-session-test", reporting=Reporting(budget_share=1.0))
    session.begin(model, max_steps=a.steps)

    train_under_session(session, model, optimizer, tok, a.steps, report_loss=True)
    delivered = session.finish()

    # A final reading on every rank at once (lockstep), then the same probes in this process alone
    # on the gathered, unsharded weights: the single-process reference.
    final = session.suite.run(model, a.steps, force=True).values
    single = single_process_probes(model, tok)

    drift = next(p for p in session.suite.probes if p.name == "kl_drift")
    reference = drift.reference_holder.snapshot
    report = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "sharded": getattr(session, "sharded", None),
        "model_numel": local_and_full_numel(model),
        "reference_numel": local_and_full_numel(reference) if reference is not None else None,
        "used": used,
        "applied": applied_report(session.applied),
        "checked": all(isinstance(s, RankCheckedSetter) for s in session.setters.values()),
        "mismatches": mismatches(session.setters),
        "knob_values": session.knob_values(),
        "final": {k: v for k, v in final.items() if not k.startswith("probe_")},
        "single": single,
        "history": session.history,
        "is_main": session.main,
        "run_id": session.run_id,
        "observations": session.seq,
        "delivered": delivered,
    }
    Path(a.out).write_text(json.dumps(report))
    leave_group()


if __name__ == "__main__":
    main()
