"""One learner rank: a `torch.distributed` process (gloo on CPU; `cpu:gloo,cuda:nccl` on CUDA,
one GPU per rank) holding an FSDP2 shard of the policy (and of the value head and reference
model), run as a Ray actor by `agentrl.learner.group.LearnerGroup`.

    set up:  init_process_group -> the policy loaded from its directory (`ModelSource`), on the
             CPU -> Learner(model, dp=DataParallel(rank, world)) (fully_shard moves the shards
             to the rank's device) -> the reference loaded and sharded the same way
    update:  every rank gets the whole batch, trains on its dealt rows, FSDP reduces gradients
    logprobs / values: each rank its rows, summed over ranks (every rank gets the full tensor)
    weights: gathered one tensor at a time; rank 0 keeps the full copy (HF names)
    save / load: torch.distributed.checkpoint (DCP), sharded: model, optimizer (+ value head,
             reference model) under DIR/dcp, reloadable by any number of ranks (resharding);
             each rank's RNG in DIR/dcp/rng_rank<r>.pt

Every method is a collective: the group calls it on every rank at once.
"""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from agentrl.learner.checkpoints import SHARDED, rng_state, safe_load, set_rng_state
from agentrl.learner.dist import (
    DataParallel,
    full_state_dict,
    join_group,
    load_sharded,
    save_sharded,
)
from agentrl.learner.local import Learner
from agentrl.learner.lora import is_peft, load_checkpoint, merge_lora_state, wrap_lora
from agentrl.learner.shard_load import load_sharded_model


def free_address(multi_node: bool = False) -> str:
    """`host:port` with a free TCP port on this node, for rank 0's rendezvous: on the loopback
    interface (127.0.0.1) unless `multi_node` (ranks on several nodes; then the node's IP as
    Ray sees it), so a one-node run opens no port on the host's network."""
    host = "127.0.0.1"
    if multi_node:
        import ray

        host = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


def rank_device(name: str | None, gpus: float, rank: int = 0) -> torch.device:
    """The device of a learner rank for `train.device` = `name` with `gpus` GPUs reserved per
    rank: `cuda:0` for `cuda`, and for `auto` with a GPU reserved (Ray sets the rank's
    `CUDA_VISIBLE_DEVICES` to its own GPU, local index 0); else the CPU (`auto` without a
    reserved GPU: a GPU Ray leaves visible belongs to another rank or worker).

    Raises:
        RuntimeError: CUDA asked for on a rank that has no CUDA device (naming the rank, its
            node and `CUDA_VISIBLE_DEVICES`): the check of `train.device=cuda` runs where the
            learner runs, not on the driver (a CPU-only head node).
    """
    name = (name or "auto").lower()
    if name == "cpu" or (name == "auto" and not gpus):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if name == "auto":
            return torch.device("cpu")
        raise RuntimeError(
            f"train.device=cuda: learner rank {rank} on {socket.gethostname()} has no CUDA device "
            f"(torch.cuda.is_available() is False, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!r}, torch {torch.__version__}); "
            "give each rank a GPU (train.learner_gpus=1 on nodes with GPUs) or set train.device=cpu")
    return torch.device("cuda:0")


@dataclass(frozen=True)
class ModelSource:
    """Where each rank loads the policy from itself (instead of receiving the driver's copy
    through Ray's object store): `path`, a model directory or a checkpoint (LoRA adapters on
    their base: `agentrl.learner.lora.load_checkpoint`), plus `lora`, the keywords of
    `agentrl.learner.lora.wrap_lora` when the driver wrapped fresh adapters (seeded: the same
    initial adapters), and `fingerprint`, the driver's `weights_fingerprint` to check against.
    Every node must see `path` (a shared file system on several nodes)."""

    path: str
    lora: dict[str, Any] | None = None
    fingerprint: tuple[int, float] | None = None

    def load(self, device: torch.device | None = None, precision: str = "fp32") -> torch.nn.Module:
        """The policy as the driver holds it, float32: in a process group with `device`, a
        plain model directory is loaded straight into this rank's FSDP2 shards on `device`
        (`agentrl.learner.shard_load.load_sharded_model`: never the whole model in memory);
        else (LoRA, adapters, no safetensors) the whole model on the CPU.

        Raises:
            ValueError: the loaded weights differ from the driver's (`fingerprint`)."""
        model = None
        plain = self.lora is None and not (Path(self.path) / "adapter_config.json").exists()
        if plain and device is not None and dist.is_initialized():
            model = load_sharded_model(self.path, device, precision)
        if model is None:
            model, _ = load_checkpoint(self.path)
            if self.lora is not None:
                model = wrap_lora(model, **self.lora)
        got = weights_fingerprint(model)
        if self.fingerprint is not None and not _same_fingerprint(got, self.fingerprint):
            raise ValueError(f"learner rank: the weights loaded from {self.path} ({got}) are not the "
                             f"driver's policy ({self.fingerprint}); is the path the same file on every node?")
        return model


def weights_fingerprint(model: torch.nn.Module) -> tuple[int, float]:
    """(parameter count, float64 sum of every parameter): a cheap check that two copies of a
    model hold the same weights (to summation rounding). Of a sharded model, over all ranks
    (a collective)."""
    params = list(model.parameters())
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    total = torch.tensor(sum(float(p.detach().sum(dtype=torch.float64)) for p in local), dtype=torch.float64)
    if len(local) and any(hasattr(p, "to_local") for p in params):
        dist.all_reduce(total)
    return sum(p.numel() for p in params), float(total)


def _same_fingerprint(a: tuple[int, float], b: tuple[int, float]) -> bool:
    return a[0] == b[0] and abs(a[1] - b[1]) <= 1e-9 * max(1.0, abs(b[1]))


class LearnerRank:
    """Rank `rank` of `world`. Plain class: Ray wraps it as an actor (one per placement-group
    bundle); a test may run ranks as threads-free processes of its own.

    Args:
        rank, world: this rank and the number of ranks.
        torch_threads: torch's thread count in this process (1 per rank on a small CPU).
    """

    def __init__(self, rank: int, world: int, torch_threads: int = 1) -> None:
        torch.set_num_threads(torch_threads)
        self.rank, self.world = rank, world
        self.learner: Learner | None = None

    def address(self, multi_node: bool = False) -> str:
        """A rendezvous address on this rank's node (asked of rank 0; `free_address`)."""
        return free_address(multi_node)

    def setup(self, master: str, model: Any, learner_kwargs: dict[str, Any], seed: int,
              gpus: float = 0.0, timeout_s: float = 1800.0) -> dict[str, Any]:
        """Join the process group at `master` (`host:port`, rank 0's; `join_group`, collectives
        time out after `timeout_s`) on `rank_device` and build the sharded learner with
        `agentrl.learner.local.Learner` keywords from `model`: a `ModelSource` (this rank
        loads the policy, and the reference once the policy is sharded) or the driver's policy
        itself (through the object store). Returns `params` (parameters of this rank's shards),
        `lr` (of the first step), `device` and `rss_mb` (peak resident MiB before and after)."""
        base_mb = self.peak_rss_mb()
        device = rank_device(learner_kwargs.get("device"), gpus, self.rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        join_group(master, self.rank, self.world, device, timeout_s)
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        kw = {**learner_kwargs, "device": device}
        if isinstance(model, ModelSource):
            kw["load_reference"] = partial(model.load, device, kw.get("precision", "fp32"))
            model = model.load(device, kw.get("precision", "fp32"))
        self.learner = Learner(model, dp=DataParallel(self.rank, self.world), **kw)
        params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                     for p in self.learner._params())
        return {"params": params, "lr": self.learner.lr, "device": str(device),
                "rss_mb": (base_mb, self.peak_rss_mb())}

    def trainer_state(self) -> dict[str, Any]:
        """The scheduler's state and the optimizer step count (the same on every rank)."""
        lr = self._l()
        return {"scheduler": lr.scheduler.state_dict(), "optimizer_steps": lr.optimizer_steps}

    def _l(self) -> Learner:
        if self.learner is None:
            raise RuntimeError("LearnerRank.setup has not run")
        return self.learner

    # -- the learner's interface, rank side ---------------------------------------------------
    def update(self, batch: dict[str, Any], algo: Any, cfg: Any, epochs: int,
               minibatches: int, seed: int, on_policy_shortcut: bool = True) -> dict[str, Any]:
        """`Learner.update` of `algo` on this rank's rows; returns the (global) metrics and the
        learner's counters (`optimizer_steps`, `nonfinite_streak`, `lr`)."""
        lr = self._l()
        m = lr.update(batch, algo, cfg, epochs=epochs, minibatches=minibatches,
                      seed=seed, on_policy_shortcut=on_policy_shortcut)
        return {"metrics": m, "optimizer_steps": lr.optimizer_steps,
                "nonfinite_streak": lr.nonfinite_streak, "lr": lr.lr}

    def logprobs(self, batch: dict[str, Any], ref: bool = False) -> torch.Tensor | None:
        """(B, T) logprobs of the whole batch (rank 0; None elsewhere)."""
        out = self._l().logprobs(batch, ref=ref)
        return out if self.rank == 0 else None

    def logprobs_and_values(self, batch: dict[str, Any]) -> tuple[torch.Tensor, ...] | None:
        """`Learner.logprobs_and_values` of the whole batch (rank 0; None elsewhere)."""
        out = self._l().logprobs_and_values(batch)
        return out if self.rank == 0 else None

    def state_dict_for_engines(self) -> dict[str, torch.Tensor] | None:
        """The policy's full weights under the plain model's names (LoRA merged), on CPU,
        gathered one tensor at a time (rank 0; None elsewhere)."""
        model = self._l().model
        keep = self.rank == 0
        if is_peft(model):
            inner = model.get_base_model()
            full = full_state_dict(inner, keep=keep)
            return merge_lora_state(full, inner) if keep else None
        full = full_state_dict(model, keep=keep)
        return full if keep else None

    def export_state(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """Full (unmerged) state dicts of the policy (its own names: PEFT names for LoRA) and
        the value head, for the consolidated Hugging Face export (rank 0; None elsewhere)."""
        lr, keep = self._l(), self.rank == 0
        out = {"policy": full_state_dict(lr.model, keep=keep)}
        if lr.value_head is not None:
            out["value_head"] = full_state_dict(lr.value_head, keep=keep)
        return out if keep else None

    def save(self, path: str) -> None:
        """Write this rank's shards of the model, optimizer (and reference) with DCP to
        `path`/dcp, and its RNG states to `path`/dcp/rng_rank<r>.pt."""
        target = Path(path) / SHARDED
        save_sharded(str(target), self._l())
        torch.save(rng_state(), target / f"rng_rank{self.rank}.pt")

    def load(self, path: str, scheduler: dict[str, Any], optimizer_steps: int) -> None:
        """Load `path`/dcp (written by any number of ranks: DCP reshards) into this rank's
        shards, the scheduler state and step counter, and this rank's RNG when the checkpoint
        has one for it (a run resumed with as many ranks)."""
        lr = self._l()
        source = Path(path) / SHARDED
        load_sharded(str(source), lr)
        lr.scheduler.load_state_dict(scheduler)
        lr.optimizer_steps = int(optimizer_steps)
        rng = source / f"rng_rank{self.rank}.pt"
        if rng.exists():
            set_rng_state(safe_load(rng))

    def shutdown(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def peak_rss_mb(self) -> float:
        """This rank's peak resident memory (MiB, `ru_maxrss`)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def pid(self) -> int:
        """This rank's process id (tests kill it)."""
        return os.getpid()
