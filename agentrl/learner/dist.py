"""Data parallelism for the learner: which rows a rank trains on, FSDP2 sharding, and the
few collectives the update needs (`torch.distributed`: gloo on CPU; on CUDA one group with two
backends, `cpu:gloo,cuda:nccl`, so the CPU tensors of the metrics go through gloo and the
CUDA tensors of FSDP through NCCL, as verl does; `backend_for`, `join_group`).

A `DataParallel` is handed to `agentrl.learner.local.Learner(dp=...)` by a learner rank
(`agentrl.learner.rank`). Every rank receives the whole batch; within each minibatch the rows
(units of rows for DPO pairs) that the forward needs are dealt round-robin, unit k to rank
k mod world, and every rank runs the same number of micro-batches (a rank with fewer rows runs
a weight-0 dummy micro-batch, so the FSDP all-gathers and reduce-scatters match). The loss is
normalised by the counts of the whole minibatch (tokens, sequences), never per rank (case L2
across ranks): each rank's loss is its share of the global token-mean, and FSDP's gradient
reduce-scatter averages over ranks, so the loss is multiplied by `world` before `backward`
to make the reduced gradient the sum of the shares, i.e. the single-process gradient.

Sharded checkpoints (`save_sharded` / `load_sharded`): the policy (with the value head) and its
optimizer, and the reference model, with `torch.distributed.checkpoint` (DCP), reloadable by
any number of ranks or, without a process group, by the in-process learner.

Sharding follows torchtitan's `parallelize`: `fully_shard` on every decoder layer (the
model's `_no_split_modules` classes), then on the root, with a `MixedPrecisionPolicy`
(`param_dtype=bf16, reduce_dtype=fp32`) under bf16. The model may stay on the CPU until then:
`fully_shard` moves each module's parameters to the mesh's device as it shards them, so a
rank never holds the whole model on its GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)


@dataclass
class DataParallel:
    """This process's place in the learner's process group: `rank` of `world` ranks."""

    rank: int
    world: int

    def my_units(self, units: torch.Tensor) -> torch.Tensor:
        """(n,) unit indices -> this rank's: units k with k mod world == rank, in order."""
        return units[self.rank :: self.world]

    def micro_count(self, n_units: int, micro_units: int) -> int:
        """Micro-batches every rank runs for `n_units` units dealt round-robin, `micro_units`
        per micro-batch: those of rank 0, which gets the most (`ceil(ceil(n / world) / m)`)."""
        per_rank = -(-n_units // self.world)
        return -(-per_rank // max(1, micro_units))

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of `t` over the ranks (in place; returned). A CPU tensor goes through gloo, a
        CUDA one through NCCL (the group of `join_group` has both on CUDA ranks); a CUDA
        tensor in a gloo-only group (CPU ranks) is reduced on a CPU copy."""
        if t.device.type == "cpu" or "nccl" in str(dist.get_backend()):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            return t
        x = t.cpu()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return t.copy_(x)

    def reduce_floats(self, values: dict[str, float], op: str = "sum") -> dict[str, float]:
        """Each key's sum (`op="sum"`), minimum or maximum over the ranks. Ranks may pass
        different keys: the union is reduced, a key a rank lacks counting as the identity of
        `op` there (0, +inf, -inf)."""
        keys: list[list[str]] = [[] for _ in range(self.world)]
        dist.all_gather_object(keys, sorted(values))
        names = sorted({k for ks in keys for k in ks})
        if not names:
            return {}
        fill = {"sum": 0.0, "min": math.inf, "max": -math.inf}[op]
        t = torch.tensor([float(values.get(k, fill)) for k in names], dtype=torch.float64)
        if op == "sum":
            self.all_sum(t)
        else:
            dist.all_reduce(t, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
        return dict(zip(names, t.tolist()))


def backend_for(device: torch.device | str) -> str:
    """The process-group backend of learner ranks on `device`: `gloo` on the CPU; on CUDA
    `cpu:gloo,cuda:nccl`, NCCL for the CUDA tensors (FSDP's all-gathers and reduce-scatters)
    and gloo for the CPU ones (`reduce_floats`' metrics, `all_gather_object`): a plain `nccl`
    group has no CPU backend, and every update's metrics would fail on it."""
    return "cpu:gloo,cuda:nccl" if torch.device(device).type == "cuda" else "gloo"


def join_group(master: str, rank: int, world: int, device: torch.device | str,
               timeout_s: float = 1800.0) -> None:
    """Join the learner's default process group at `master` (`host:port`, TCP rendezvous)
    as `rank` of `world`, with `backend_for(device)`; a collective that waits longer than
    `timeout_s` seconds fails (torch's own timeout). No-op when this process is in one already."""
    if dist.is_initialized():
        return
    dist.init_process_group(backend_for(device), init_method=f"tcp://{master}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))


def total_norm(norm: Any) -> float:
    """The float of a gradient norm returned by `clip_grad_norm_` (a DTensor for sharded
    parameters: its full value, the global norm over every rank's shards)."""
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers: modules whose class is in `_no_split_modules` of the
    (PEFT-unwrapped) transformers model, e.g. `Qwen2DecoderLayer`; [] when it names none."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def mixed_precision(precision: str) -> Any:
    """The FSDP2 `MixedPrecisionPolicy` of `train.precision`: under `bf16` the parameters are
    all-gathered and computed in bfloat16 and the gradients reduced in float32 (torchtitan,
    prime-rl); the sharded master weights and AdamW state stay float32. None for `fp32`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision != "bf16":
        return None
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard(module: torch.nn.Module, *, device: torch.device | None = None,
          precision: str = "fp32") -> torch.nn.Module:
    """FSDP2 `fully_shard` of every decoder layer, then of the root, over the default process
    group (the module's parameters become DTensors sharded on dim 0, on `device`: a module
    still on the CPU is moved there one `fully_shard` group at a time), with
    `mixed_precision(precision)`. Returns the module."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if isinstance(module, FSDPModule):  # sharded already (`agentrl.learner.shard_load`)
        return module
    dev = torch.device(device) if device is not None else next(module.parameters()).device
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    kw: dict[str, Any] = {"mesh": mesh}
    policy = mixed_precision(precision)
    if policy is not None:
        kw["mp_policy"] = policy
    for layer in decoder_layers(module):
        fully_shard(layer, **kw)
    fully_shard(module, **kw)
    return module


def full_state_dict(module: torch.nn.Module, *, keep: bool) -> dict[str, torch.Tensor]:
    """The module's state dict with every sharded tensor gathered, one tensor at a time (each
    rank must call it: the gathers are collectives); the full tensors are kept, on CPU, only
    where `keep` (rank 0), so no rank holds more than one full copy. {} where not `keep`."""
    out: dict[str, torch.Tensor] = {}
    for k, v in module.state_dict().items():
        gathered = hasattr(v, "full_tensor")
        full = v.full_tensor() if gathered else v
        if keep:  # a gathered tensor is a new one already: no second host copy of it
            out[k] = full.detach().to("cpu", copy=not gathered)
        del full
    return out


def _dcp_state(learner: Any) -> tuple[torch.nn.ModuleDict, dict[str, Any]]:
    """The module holding `learner`'s policy (and value head) and the DCP state of it, its
    optimizer and its reference model (`model`, `optim`, `ref`)."""
    mods: dict[str, torch.nn.Module] = {"policy": learner.model}
    if learner.value_head is not None:
        mods["value_head"] = learner.value_head
    container = torch.nn.ModuleDict(mods)
    msd, osd = get_state_dict(container, learner.optimizer)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    if learner.ref_model is not None:
        state["ref"] = get_model_state_dict(learner.ref_model)
    return container, state


def save_sharded(folder: str, learner: Any) -> None:
    """Write `learner`'s (a `Learner`: `model`, `value_head`, `optimizer`, `ref_model`) shards of
    the policy, value head, optimizer and reference model to `folder` with DCP (a collective)."""
    dcp.save(_dcp_state(learner)[1], checkpoint_id=folder)


def load_sharded(folder: str, learner: Any, *, no_dist: bool = False) -> None:
    """Load the DCP checkpoint in `folder` (written by any number of ranks: DCP reshards) into
    `learner`'s policy, value head, optimizer and reference model; `no_dist`: without a process
    group (the in-process learner)."""
    container, state = _dcp_state(learner)
    dcp.load(state, checkpoint_id=folder, no_dist=no_dist)
    set_state_dict(container, learner.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    if learner.ref_model is not None:
        set_model_state_dict(learner.ref_model, state["ref"])
