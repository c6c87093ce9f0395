"""Start a 2-process run of a worker script and collect each rank's JSON report."""

from __future__ import annotations

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

    from actuator.agents.models import tiny_llama
    from actuator.agents.probes import KLDrift, Perplexity, ProbeSuite
    from actuator.agents.sharded import rank_and_world
    from actuator.agents.testing import HELD_OUT

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank_and_world()[0] != 0:
        return {}
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
