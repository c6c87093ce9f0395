"""Training sharded by PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) under control.

Under FSDP2 every parameter is a ``DTensor`` holding one shard per rank, and a forward pass
all-gathers each sharded module's parameters with *every* rank taking part. So, unlike DDP (where
rank 0 probes alone on its full replica):

* **Probes are collectives.** Every rank runs each probe's forward passes in lockstep, on the same
  inputs and the same schedule: which probes run at a step, in which order and on how many examples
  is decided on rank 0 and broadcast (``ProbeSuite.lockstep``, set by the callback to its
  rank-0 broadcast). Every rank computes the same values; rank 0 sends them.
* **References are sharded like the model.** ``FSDPModule`` refuses ``deepcopy``; a drift probe's
  frozen reference is :func:`sharded_copy`: the same architecture built on the meta device,
  ``fully_shard``-ed on the same mesh module by module, and each rank's local shards copied in. No
  rank holds a full copy. (The KL anchor keeps no reference model at all: it caches the reference's
  top-k log-probs at setup, a forward pass every rank runs alike.)
* **Knob values are checked on every rank** (:class:`RankCheckedSetter`): a decision's value is
  gathered from every rank after it is applied, and a rank that disagrees is logged as an error;
  the acknowledgement carries the value every rank holds.
* **Rollback restores shards**: :func:`save_sharded` / :func:`load_sharded` write and read a
  ``torch.distributed.checkpoint`` (DCP) of the model's and optimizer's sharded state dicts, each
  rank its own shards, in a directory every rank can reach.

The Trainer callback sets this up at ``train()`` start; ``ControlSession.begin(model)`` does the same
for a loop of your own when ``model`` is ``fully_shard``-ed in a process group of more than one.

FSDP1 (``FullyShardedDataParallel``) and DeepSpeed stay refused (``_hf_compat.sharding_unsupported``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("actuator.agents")

__all__ = ["is_fully_sharded", "reshard", "rank_and_world", "from_rank0", "sharded_copy", "local_and_full_numel",
           "RankCheckedSetter", "check_on_every_rank", "save_sharded", "load_sharded", "SHARDED_DIR"]

SHARDED_DIR = "actuator-sharded"  # beside a Trainer checkpoint: the sharded model and optimizer state


def _fsdp_module_class() -> type | None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return None
    return FSDPModule


def is_fully_sharded(model: Any) -> bool:
    """Whether ``model`` (or a module inside it) was ``fully_shard``-ed (FSDP2)."""
    fsdp = _fsdp_module_class()
    modules = getattr(model, "modules", None)
    if fsdp is None or modules is None:
        return False
    return any(isinstance(m, fsdp) for m in modules())


def reshard(*modules: Any) -> None:
    """Free the gathered parameters of every FSDP2 module in ``modules``. FSDP2 keeps the root
    module's parameters gathered after a forward pass (backward would gather them again at once);
    after a probe's forward passes under ``no_grad`` no backward follows, and each rank would go on
    holding the root's full parameters (the embeddings and the head: most of a small model)."""
    fsdp = _fsdp_module_class()
    for module in modules:
        for m in getattr(module, "modules", list)():
            if fsdp is not None and isinstance(m, fsdp):
                m.reshard()


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the world size (0, 1 when torch.distributed is not initialised)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return 0, 1
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def from_rank0(value: Any) -> Any:
    """``value`` as rank 0 has it, on every rank (itself when not distributed)."""
    if rank_and_world()[1] == 1:
        return value
    import torch.distributed as dist

    payload = [value]
    dist.broadcast_object_list(payload, src=0)
    return payload[0]


def _gather(value: Any) -> list[Any]:
    if rank_and_world()[1] == 1:
        return [value]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def _mesh_of(model: Any) -> Any:
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p, DTensor):
            return p.device_mesh
    raise ValueError("a fully_shard-ed model without DTensor parameters")


def sharded_copy(model: Any) -> Any:
    """A frozen copy of the ``fully_shard``-ed ``model``, sharded the same way: each rank holds only
    its shard of it. ``FSDPModule`` cannot be deep-copied, so the copy is built from the model's
    class and ``config`` (a transformers model) on the meta device, every module the original
    shards is ``fully_shard``-ed on the same mesh, and the local shards and buffers are copied in."""
    import torch
    from torch.distributed.fsdp import fully_shard

    fsdp = _fsdp_module_class()
    assert fsdp is not None
    config = getattr(model, "config", None)
    base = next(c for c in type(model).__mro__ if not issubclass(c, fsdp))
    if config is None:
        raise TypeError(f"cannot copy the fully_shard-ed {base.__name__}: FSDP2 modules cannot be deep-copied and "
                        "it has no transformers config to rebuild it from; pass the drift probe a sharded "
                        "reference (reference=)")
    mesh = _mesh_of(model)
    with torch.device("meta"):
        copy = base(config)
    modules = dict(copy.named_modules())
    for name, module in model.named_modules():  # inner modules first, the way they were sharded
        if name and isinstance(module, fsdp):
            fully_shard(modules[name], mesh=mesh)
    fully_shard(copy, mesh=mesh)
    copy.to_empty(device=next(model.parameters()).device)
    with torch.no_grad():
        mine = dict(copy.named_parameters())
        for name, p in model.named_parameters():
            _local(mine[name]).copy_(_local(p))
        buffers = dict(copy.named_buffers())
        for name, b in model.named_buffers():
            buffers[name].copy_(b)
    for p in copy.parameters():
        p.requires_grad_(False)
    copy.eval()
    return copy


def _local(tensor: Any) -> Any:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def local_and_full_numel(module: Any) -> tuple[int, int]:
    """(elements this rank holds, elements of the whole module) over ``module``'s parameters."""
    local = full = 0
    for p in module.parameters():
        local += _local(p).numel()
        full += p.numel()
    return local, full


class RankCheckedSetter:
    """A knob setter whose ``apply`` returns the value in effect on every rank: after applying,
    every rank's read-back value is gathered; ranks that disagree are logged as an error (the
    value returned, and acknowledged, is rank 0's). Every rank applies the same decisions in the
    same order (rank 0's broadcast), so the gathers line up."""

    def __init__(self, setter: Any) -> None:
        self.inner = setter
        self.mismatches = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self) -> float:
        return self.inner.read()

    def apply(self, value: float) -> float:
        applied = float(self.inner.apply(value))
        values = _gather(applied)
        if any(v != values[0] for v in values):
            self.mismatches += 1
            log.error("actuator: knob %s: the ranks disagree on the value in effect after a decision: %s "
                      "(rank 0's is acknowledged); the ranks no longer train alike", self.inner.name,
                      ", ".join(f"rank {i}: {v:.6g}" for i, v in enumerate(values)))
        return values[0]


def check_on_every_rank(setters: dict[str, Any]) -> None:
    """Wrap each of ``setters`` (in place) in a :class:`RankCheckedSetter` when more than one
    process trains: a decision's acknowledged value is then the one every rank holds."""
    if rank_and_world()[1] > 1:
        for name, setter in setters.items():
            if not isinstance(setter, RankCheckedSetter):
                setters[name] = RankCheckedSetter(setter)


def save_sharded(path: str, model: Any, optimizer: Any = None, scheduler: Any = None) -> None:
    """Write the sharded state of ``model`` (and ``optimizer``) to ``path`` with
    ``torch.distributed.checkpoint``: every rank writes its own shards (a collective)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_sd}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    dcp.save(state, checkpoint_id=path)
    if scheduler is not None:
        rank = rank_and_world()[0]
        torch.save(scheduler.state_dict(), os.path.join(path, f"scheduler-rank{rank}.pt"))


def load_sharded(path: str, model: Any, optimizer: Any = None, scheduler: Any = None) -> None:
    """Load what :func:`save_sharded` wrote into the live ``model`` (and ``optimizer``) in place."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_sd}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=state["model"],
                   optim_state_dict=state.get("optimizer", {}))
    sched_file = os.path.join(path, f"scheduler-rank{rank_and_world()[0]}.pt")
    if scheduler is not None and os.path.exists(sched_file):
        scheduler.load_state_dict(torch.load(sched_file, weights_only=False))
