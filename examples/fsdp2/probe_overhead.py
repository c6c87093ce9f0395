"""Probe cost under FSDP2 against DDP on the same tiny model, in one run (2 processes, gloo, CPU).

    python examples/fsdp2/probe_overhead.py [--repeats 7]

The same probes (KL drift and perplexity on the held-out texts the tests use) measure a tiny Llama
(``actuator.agents.models.tiny_llama``) twice: wrapped in DDP, where rank 0 probes alone on its
replica, and ``fully_shard``-ed, where both ranks run every forward pass in lockstep (the
schedule broadcast from rank 0, the weights all-gathered per module). Prints rank 0's median
seconds per full measurement in each mode and their ratio. On a tiny model the FSDP2 figure is
mostly communication and lockstep overhead; on a large model on GPUs the all-gathers overlap
compute and the ratio is a different number.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _worker(rank: int, port: int, repeats: int, out: list) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from actuator.agents.models import tiny_llama
    from actuator.agents.probes import KLDrift, Perplexity, ProbeSuite
    from actuator.agents.sharded import from_rank0
    from actuator.agents.testing import HELD_OUT, char_tokenizer

    tok = char_tokenizer()

    def suite() -> ProbeSuite:
        return ProbeSuite([KLDrift(HELD_OUT, tok, max_length=32), Perplexity(HELD_OUT, tok, max_length=32)],
                          budget_share=1.0)

    def timed(run) -> float:
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    ddp = torch.nn.parallel.DistributedDataParallel(tiny_llama(seed=0))
    plain = suite()
    if rank == 0:
        plain.setup(ddp.module)
    ddp_s = timed(lambda: plain.run(ddp.module, 0, force=True) if rank == 0 else None)

    mesh = init_device_mesh("cpu", (2,))
    model = tiny_llama(seed=0)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sharded = suite()
    sharded.lockstep = from_rank0
    sharded.setup(model)
    fsdp_s = timed(lambda: sharded.run(model, 0, force=True))
    if rank == 0:
        print(f"probe seconds per measurement (median of {repeats}): DDP {ddp_s:.4f}, FSDP2 {fsdp_s:.4f}, "
              f"ratio FSDP2/DDP {fsdp_s / ddp_s:.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, a.repeats, []), nprocs=2, join=True)


if __name__ == "__main__":
    main()
