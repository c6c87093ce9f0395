"""Start a 2-process run of a worker script and collect each rank's JSON report."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

try:
    from actuator.testing import free_port
except ImportError:  # before tests/servers.py moved into actuator.testing
    from servers import free_port


def run_two_ranks(tmp_path: Path, worker: Path, args: list[str], env_for: Callable[[int, int], dict[str, str]],
                  *, timeout: float = 120) -> list[dict]:
    """Run ``worker`` twice (ranks 0 and 1) with ``args`` plus ``--out``, each with the environment
    ``env_for(rank, port)`` adds (``port``: a free port for the process group); fail with the rank's
    log when one exits non-zero; the reports each rank wrote."""
    port = free_port()
    procs, outs, logs = [], [], []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("ACTUATOR_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        env.update(env_for(rank, port))
        out = tmp_path / f"rank{rank}.json"
        log = open(tmp_path / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, str(worker), *args, "--out", str(out)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, cwd=str(tmp_path), start_new_session=True))
        outs.append(out)
        logs.append(log)
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, (tmp_path / f"rank{rank}.log").read_text()[-4000:]
    return [json.loads(o.read_text()) for o in outs]


# -- shared by the FSDP2 workers and their tests ----------------------------------------------------
def sharded_tiny_llama() -> tuple[int, object]:
    """In a worker started by :func:`run_two_ranks` with ``FSDP_TEST_RANK`` / ``FSDP_TEST_PORT``: join
    the 2-process gloo group, and the seed tiny Llama ``fully_shard``-ed on a CPU mesh (each decoder
    layer, then the root). (this rank, the model)"""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from actuator.agents.models import tiny_llama

    rank, port = int(os.environ["FSDP_TEST_RANK"]), int(os.environ["FSDP_TEST_PORT"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    model = tiny_llama(seed=0)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return rank, model


def single_process_probes(model, tokenizer) -> dict[str, float]:
    """In a worker, on rank 0: the KL-drift and perplexity probes run in this process alone on the
    ``fully_shard``-ed ``model``'s gathered, unsharded weights (reference: the seed model), plus
    ``baseline.perplexity`` on the seed model itself. A collective: every rank must call it (the
    weights are gathered on all); rank 0 measures, the others get ``{}``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from actuator.agents.sharded import rank_and_world

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return probes_on_full_weights(full, tokenizer) if rank_and_world()[0] == 0 else {}


def probes_on_full_weights(full: dict, tokenizer) -> dict[str, float]:
    """The KL-drift and perplexity probes run in this process alone on the seed tiny Llama loaded
    with the gathered weights ``full`` (reference: the seed model), plus ``baseline.perplexity``
    on the seed model itself."""
    from actuator.agents.models import tiny_llama
    from actuator.agents.probes import KLDrift, Perplexity, ProbeSuite
    from actuator.agents.testing import HELD_OUT

    plain = tiny_llama(seed=0)
    plain.load_state_dict(full)
    fresh = ProbeSuite([KLDrift(HELD_OUT, tokenizer, max_length=32, reference=tiny_llama(seed=0)),
                        Perplexity(HELD_OUT, tokenizer, max_length=32)], budget_share=1.0)
    fresh.setup(plain)
    single = {k: v for k, v in fresh.run(plain, 0, force=True).values.items() if not k.startswith("probe_")}
    start = tiny_llama(seed=0)
    baseline = ProbeSuite([Perplexity(HELD_OUT, tokenizer, max_length=32)], budget_share=1.0)
    baseline.setup(start)
    single["baseline.perplexity"] = baseline.run(start, 0, force=True).values["perplexity"]
    return single


def control_report(cb, trainer, rank: int, final: dict, single: dict, restored: dict | None) -> dict:
    """What a sharded worker reports of its callback's run: decisions, knob values, probe readings
    (``final`` in lockstep, ``single`` in one process), rollbacks, who talked to the service."""
    return {
        "applied": applied_report(cb.session.applied),
        "mismatches": mismatches(cb.session.setters),
        "knob_values": cb.session.knob_values(),
        "final": {k: v for k, v in final.items() if not k.startswith("probe_")},
        "single": single,
        "history": cb.session.history if rank == 0 else [],
        "rollbacks": cb.session.rollbacks,
        "restored": restored,
        "is_main": cb.session.main,
        "run_id": cb.session.run_id,
        "observations": cb.session.seq,
        "global_step": trainer.state.global_step,
    }


def assert_rolled_back_alike(r0: dict, r1: dict, bad_from: int) -> None:
    """The canary's breach rolled both ranks back once, to the same checkpoint before ``bad_from``,
    each rank to the weights it saved there; only rank 0 talked to the service."""
    assert len(r0["rollbacks"]) == len(r1["rollbacks"]) == 1
    assert [{k: v for k, v in rb.items() if k != "checkpoint"} for rb in r0["rollbacks"]] == [
        {k: v for k, v in rb.items() if k != "checkpoint"} for rb in r1["rollbacks"]]
    assert r0["rollbacks"][0]["to_step"] < bad_from <= r0["rollbacks"][0]["at_step"]
    for r in (r0, r1):
        assert r["restored"] == {"equal_to_saved": True, "changed": True}, r["restored"]
    assert r0["is_main"] and r0["run_id"] and r0["observations"] > 0
    assert not r1["is_main"] and r1["run_id"] is None and r1["observations"] == 0


def assert_sharded_like_the_model(r0: dict, r1: dict) -> None:
    """Each rank holds about half of every parameter (the halves add up to the model), and the
    drift reference is sharded the same way: no rank holds more than its shard of it."""
    full = r0["model_numel"][1]
    assert r0["model_numel"][0] + r1["model_numel"][0] == full == r1["model_numel"][1]
    assert max(r0["model_numel"][0], r1["model_numel"][0]) < 0.6 * full
    assert r0["reference_numel"] == r0["model_numel"] and r1["reference_numel"] == r1["model_numel"]


def assert_probes_match_single_process(r0: dict, r1: dict) -> None:
    """The final readings are the same on both ranks and equal to :func:`single_process_probes`;
    the baseline reading (rank 0's first observation) is the seed model's."""
    import pytest

    assert r0["final"] == r1["final"]
    single = r0["single"]
    assert r0["final"]["kl_drift"] > 1e-4, "training moved the model away from its reference"
    assert r0["final"]["kl_drift"] == pytest.approx(single["kl_drift"], rel=1e-4, abs=1e-6)
    assert r0["final"]["perplexity"] == pytest.approx(single["perplexity"], rel=1e-5)
    baseline = r0["history"][0]
    assert baseline["step"] == 0 and baseline["probes"]["kl_drift"] == pytest.approx(0.0, abs=1e-6)
    assert baseline["probes"]["perplexity"] == pytest.approx(single["baseline.perplexity"], rel=1e-5)


# -- shared by the workers --------------------------------------------------------------------------
def worker_parser(steps: int) -> argparse.ArgumentParser:
    """A worker's command line: the service's ``--url``, the report's path ``--out`` (as
    :func:`run_two_ranks` passes it), ``--steps`` (default ``steps``); the worker may add more."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=steps)
    return ap


def drift_lr_policy(name: str, **sections) -> dict:
    """The workers' policy ``name``: a PID on the learning rate holding KL drift at 0 (kp 5, ki 1);
    ``sections``: more of the document (guardrails)."""
    return {"name": name, "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                           "setpoint": 0.0, "kp": 5.0, "ki": 1.0}], **sections}


def record_lr(optimizer) -> list[float]:
    """The learning rate every ``optimizer.step()`` really runs with (a step pre-hook), in order."""
    used: list[float] = []
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    return used


def applied_report(entries: list[dict]) -> list[dict]:
    """What a worker reports of the decisions its rank applied (a callback's or session's ``applied``)."""
    return [{k: e[k] for k in ("number", "step", "knob", "applied")} for e in entries]


def mismatches(setters) -> int:
    """How many times the ranks' knob values differed, summed over the rank-checked setters."""
    from actuator.agents.sharded import RankCheckedSetter

    return sum(s.mismatches for s in setters.values() if isinstance(s, RankCheckedSetter))


def leave_group() -> None:
    """Tear the gloo group down before the interpreter exits: left to process exit, its C++ threads
    were sometimes destroyed while joinable ("terminate called without an active exception",
    SIGABRT, exit -6) on a loaded machine."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def training_args(out: str, rank: int, steps: int, **fields):
    """The tiny CPU ``TrainingArguments`` of a worker writing its report to ``out``: ``steps`` steps
    of 4 rows, logged every step, output in ``out-<rank>`` beside the report; ``fields`` add or
    override (the learning rate, the schedule, the checkpoints)."""
    from transformers import TrainingArguments

    return TrainingArguments(**{
        "output_dir": str(Path(out).parent / f"out-{rank}"), "max_steps": steps, "per_device_train_batch_size": 4,
        "logging_steps": 1, "report_to": [], "seed": 0, "dataloader_num_workers": 0, "disable_tqdm": True,
        "use_cpu": True, **fields})


def ddp_trainer(out: str, rank: int, steps: int, train_dataset, **fields) -> tuple[object, list[float]]:
    """In a DDP worker (RANK / WORLD_SIZE / ... in the environment): a ``Trainer`` of the seed tiny
    Llama on ``train_dataset`` under CPU DDP over gloo, a linear schedule, no checkpoints (``fields``
    add or override :func:`training_args`'s: the learning rate, the warm-up). (the trainer, the lr
    every optimizer step runs with: its optimizer is created here)"""
    from transformers import Trainer

    from actuator.agents.models import tiny_llama

    args = training_args(
        out, rank, steps, lr_scheduler_type="linear", save_strategy="no",
        # CPU DDP: with use_cpu=True and WORLD_SIZE > 1, accelerate's PartialState picks
        # DistributedType.MULTI_CPU; ddp_backend="gloo" names the backend (accelerate/state.py).
        ddp_backend="gloo", ddp_find_unused_parameters=False, **fields)
    trainer = Trainer(model=tiny_llama(seed=0), args=args, train_dataset=train_dataset)
    trainer.create_optimizer()
    return trainer, record_lr(trainer.optimizer)


def schedule_shape(trainer, steps: int) -> list[float]:
    """The trainer's schedule's own factor at steps 0..``steps``: the learning-rate knob is its peak,
    the lr used is peak x shape."""
    return [float(trainer.lr_scheduler.lr_lambdas[0](k)) for k in range(steps + 1)]


def train_under_session(session, model, optimizer, tok, steps: int, *, readings: dict | None = None,
                        report_loss: bool = False) -> None:
    """The FSDP2 session workers' plain loop: ``steps`` steps on the narrow task (4 rows a step,
    the same on every rank: FSDP2 reduce-scatters the gradients), each followed by a step boundary
    of ``session`` with ``readings`` (and the loss as a metric, ``report_loss``). Rank 0 lets its
    sender deliver what it has before each boundary (``sender.flush``), so decisions come back
    within the run's few steps whatever the machine's load."""
    from actuator.agents.testing import NARROW_TASK

    enc = tok(NARROW_TASK, truncation=True, max_length=32, padding="max_length", return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    batch = 4
    model.train()
    for step in range(1, steps + 1):
        rows = [(step * batch + i) % len(NARROW_TASK) for i in range(batch)]
        loss = model(input_ids=enc["input_ids"][rows], attention_mask=enc["attention_mask"][rows],
                     labels=labels[rows]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if session.sender is not None:
            session.sender.flush(10.0)
        session.step(step, model, readings=readings, metrics={"loss": loss.item()} if report_loss else None)
