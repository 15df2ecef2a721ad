"""One learner rank: a `torch.distributed` process (gloo on CPU, NCCL on CUDA) holding an FSDP2
shard of the policy (and of the value head and reference model), run as a Ray actor by
`agentrl.learner.group.LearnerGroup`.

    set up:  init_process_group -> Learner(model, dp=DataParallel(rank, world)) (fully_shard)
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
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from agentrl.learner.checkpoints import SHARDED, rng_state, safe_load, set_rng_state
from agentrl.learner.dist import DataParallel, full_state_dict, load_sharded, save_sharded
from agentrl.learner.local import Learner, resolve_device
from agentrl.learner.lora import is_peft, merge_lora_state


def free_address() -> str:
    """`host:port` of this node with a free TCP port, for rank 0's rendezvous (the node's IP
    as Ray sees it; 127.0.0.1 for a local cluster)."""
    try:
        import ray

        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except Exception:  # noqa: BLE001 - outside Ray
        host = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"


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

    def address(self) -> str:
        """A rendezvous address on this rank's node (asked of rank 0)."""
        return free_address()

    def setup(self, master: str, model: Any, learner_kwargs: dict[str, Any], seed: int) -> dict[str, Any]:
        """Join the process group at `master` (`host:port`, rank 0's) and build the sharded
        learner from `model` (the driver's policy, the same on every rank) with
        `agentrl.learner.local.Learner` keywords. Returns `params` (parameters of this rank's
        shards) and `lr` (of the first step)."""
        device = resolve_device(learner_kwargs.get("device"))
        if device.type == "cuda":
            torch.cuda.set_device(device.index or 0)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend, init_method=f"tcp://{master}", rank=self.rank,
                                    world_size=self.world)
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        self.learner = Learner(model, dp=DataParallel(self.rank, self.world), **learner_kwargs)
        params = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                     for p in self.learner._params())
        return {"params": params, "lr": self.learner.lr}

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
