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

**DeepSpeed ZeRO-2 and ZeRO-3** (through the HF ``Trainer``: a ``deepspeed=`` config or accelerate's
DeepSpeed plugin) take the same path: probes in lockstep on every rank, knob values checked on every
rank. What differs is DeepSpeed's own (measured on a 2-process CPU gloo mesh, DeepSpeed 0.19):

* Under ZeRO-3 a forward pass is a collective: on rank 0 alone it waits forever in DeepSpeed's
  parameter fetch, and ``GatheredParameters`` on rank 0 alone fails with a gloo collective
  mismatch; with every rank taking part both work. Under ZeRO-2 the weights are replicated, yet the
  probes still run on every rank alike (one rule for both stages).
* A drift probe's reference under ZeRO-3 is :func:`deepspeed_copy`: the full weights gathered with
  every rank taking part, loaded into a model built from the config, and partitioned by TRL's own
  ``prepare_deepspeed`` (the way TRL shards a ``ref_model``); under ZeRO-2 a deep copy, as without
  sharding.
* Rollback loads the Trainer's own DeepSpeed checkpoint (``engine.load_checkpoint``) on every rank
  (``_hf_compat.load_deepspeed_checkpoint``). The callback writes no shards of its own.

FSDP1 (``FullyShardedDataParallel``) stays refused, and so does every DeepSpeed setup not tested here
(:func:`deepspeed_unsupported`; ``_hf_compat.sharding_unsupported``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("actuator.agents")

__all__ = ["is_fully_sharded", "reshard", "rank_and_world", "from_rank0", "sharded_copy", "local_and_full_numel",
           "RankCheckedSetter", "check_on_every_rank", "save_sharded", "load_sharded", "SHARDED_DIR",
           "deepspeed_engine", "deepspeed_unsupported", "is_zero3", "deepspeed_copy"]

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
    """(elements this rank holds, elements of the whole module) over ``module``'s parameters
    (FSDP2's DTensors, DeepSpeed ZeRO-3's partitions, or whole tensors)."""
    local = full = 0
    for p in module.parameters():
        if hasattr(p, "ds_tensor"):  # ZeRO-3: this rank's partition (padded to equal sizes)
            local += p.ds_tensor.numel()
            full += p.ds_numel
            continue
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


# -- DeepSpeed ZeRO-2 / ZeRO-3 ------------------------------------------------------------------------
TESTED_ZERO_STAGES = (2, 3)


def deepspeed_engine(trainer: Any) -> Any | None:
    """The ``DeepSpeedEngine`` ``trainer`` trains through, or ``None`` (not DeepSpeed, or not yet
    prepared: the engine exists from ``train()`` start)."""
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return None
    wrapped = getattr(trainer, "model_wrapped", None)
    return wrapped if hasattr(wrapped, "zero_optimization_stage") else None


def _deepspeed_config(trainer: Any) -> dict[str, Any]:
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
    config = getattr(plugin, "deepspeed_config", None)
    return config if isinstance(config, dict) else {}


def deepspeed_unsupported(trainer: Any) -> str | None:
    """Why the agent refuses ``trainer``'s DeepSpeed setup, or ``None`` (not DeepSpeed, or ZeRO-2 /
    ZeRO-3 as tested here: a 2-process CPU gloo mesh, DeepSpeed 0.19, no offload, no pipeline).

    Refused because it was not run here: ZeRO stages 0 and 1, pipeline parallelism (a
    ``PipelineEngine`` steps with ``train_batch()``, which the HF Trainer does not call), ZeRO
    offload of parameters or optimizer state (ZeRO-Infinity to NVMe needs a local NVMe device and
    DeepSpeed's async-io op; offload to the CPU was not exercised), tensor (AutoTP) and sequence
    (Ulysses) parallelism."""
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return None
    config = _deepspeed_config(trainer)
    zero = config.get("zero_optimization") or {}
    engine = deepspeed_engine(trainer)
    stage = engine.zero_optimization_stage() if engine is not None else zero.get("stage", 0)
    tail = ("Supported: ZeRO-2 and ZeRO-3 without offload (tested on a 2-process CPU gloo mesh); or train "
            "without ActuatorCallback.")
    if type(engine).__name__ == "PipelineEngine" or config.get("pipeline"):
        return ("DeepSpeed pipeline parallelism is not supported: not tested here (the HF Trainer never calls "
                "PipelineEngine.train_batch, and the agent's lockstep probes assume every rank holds every layer's "
                "shard). " + tail)
    for part in ("offload_param", "offload_optimizer"):
        device = (zero.get(part) or {}).get("device")
        if device not in (None, "none"):
            reason = ("ZeRO-Infinity offload to NVMe needs a local NVMe device and DeepSpeed's async-io op, neither "
                      "of which is on the test machine" if device == "nvme" else
                      f"offload to {device!r} was not exercised on the test mesh")
            return f"DeepSpeed zero_optimization.{part}.device={device!r} is not supported: {reason}. {tail}"
    if int(stage or 0) not in TESTED_ZERO_STAGES:
        return (f"DeepSpeed ZeRO stage {stage} is not supported: only stages 2 and 3 were run under control on the "
                f"test mesh. {tail}")
    if int((config.get("tensor_parallel") or {}).get("autotp_size", 1) or 1) > 1 or \
            int(config.get("sequence_parallel_size", 1) or 1) > 1:
        return f"DeepSpeed tensor or sequence parallelism is not supported: not tested here. {tail}"
    return None


def is_zero3(model: Any) -> bool:
    """Whether ``model``'s parameters are partitioned by DeepSpeed ZeRO-3 (they carry ``ds_id``)."""
    parameters = getattr(model, "parameters", None)
    return parameters is not None and any(hasattr(p, "ds_id") for p in parameters())


def _accelerator_state() -> Any:
    from accelerate.state import AcceleratorState

    class _Holder:  # what trl's prepare_deepspeed reads of an Accelerator: .state.deepspeed_plugin
        state = AcceleratorState()

    return _Holder()


def deepspeed_copy(model: Any) -> Any:
    """A frozen copy of the ZeRO-3 ``model``, partitioned like it. A collective: every rank calls
    it. The full weights are gathered with every rank taking part (``GatheredParameters``), loaded
    into a model built from the class and ``config``, and handed to TRL's ``prepare_deepspeed``,
    which partitions it the way TRL partitions a trainer's ``ref_model`` under ZeRO-3. Each rank
    holds the full weights only while the copy is built."""
    import deepspeed
    from trl.models.utils import prepare_deepspeed

    config = getattr(model, "config", None)
    if config is None:
        raise TypeError(f"cannot copy the ZeRO-3 {type(model).__name__}: it has no transformers config to rebuild "
                        "it from; pass the drift probe a reference (reference=)")
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    copy = type(model)(config)
    copy.load_state_dict(state)
    del state
    for p in copy.parameters():
        p.requires_grad_(False)
    engine = prepare_deepspeed(copy, _accelerator_state())
    module = engine.module
    module.__dict__["_actuator_engine"] = engine  # keeps the engine (its partition hooks) alive with the copy
    module.eval()
    return module

