"""The learner as seen by the training loop: one object, in-process or N ranks.

    make_learner(cfg, model, ...) ─ train.learner_workers = 0 ─▶ Learner (this process)
                                  └ N >= 1 ─▶ LearnerGroup ── Ray placement group, N bundles
                                               │   (train.learner_cpus / learner_gpus each)
                                               ├─ LearnerRank 0 ─┐ torch.distributed
                                               └─ LearnerRank N-1┘ (gloo / NCCL), FSDP2

Both answer the same calls: `update(batch, algo, cfg, ...) -> metrics`, `logprobs(batch,
ref=)`, `logprobs_and_values(batch)`, `state_dict_for_engines()`, `save(dir, tok, extra)`,
`load(dir)`, `lr`, `algo_state`, `nonfinite_streak`. The group sends each call to every rank
(the batch once, through the object store) and returns rank 0's answer; the loop does not
know how many ranks there are.

Checkpoints of a group (`save`): the consolidated Hugging Face export of the policy (the
driver's copy of the model with the gathered weights: `save_pretrained`, safetensors; LoRA:
the adapters), the tokenizer, the sharded state of every rank under DIR/dcp (model,
optimizer, value head, reference; `torch.distributed.checkpoint`), and
DIR/trainer_state.pt (scheduler, step counter, the driver's RNG), DIR/algo_state.pt and
DIR/agentrl_state.json. It resumes with any `learner_workers` (DCP reshards), 0 included.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.infra.cluster import ensure_ray
from agentrl.learner.checkpoints import (
    ALGO_STATE,
    RUN_STATE,
    SHARDED,
    TRAINER_STATE,
    read_state,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from agentrl.learner.local import Learner
from agentrl.learner.rank import LearnerRank, ModelSource, weights_fingerprint

PLACEMENT_TIMEOUT_S = 60.0
"""Seconds to wait for the learner ranks' placement group before failing with what is free."""


SHUTDOWN_TIMEOUT_S = 10.0
"""Seconds `LearnerGroup.shutdown` waits for the ranks to leave their process group."""


class PlacementError(RuntimeError):
    """The learner ranks' placement group could not be placed (too few CPUs / GPUs free)."""


class LearnerTimeoutError(RuntimeError):
    """Learner ranks did not answer a call within `train.learner_timeout_s` (a hung collective)."""


def learner_kwargs(cfg: Any, algo: Any, lr_schedule: Any) -> dict[str, Any]:
    """The `agentrl.learner.local.Learner` keywords of a run (`train.*`, the algorithm's needs)."""
    return dict(lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, grad_clip=cfg.train.grad_clip,
                temperature=cfg.rollout.temperature, micro_batch_size=cfg.train.micro_batch_size,
                prefix_share=cfg.train.prefix_share, compile=cfg.train.compile,
                skip_zero_advantage=cfg.train.skip_zero_advantage,
                use_ref=algo.needs_reference(cfg.algo) and cfg.placement.reference == "inline",
                value_head=algo.value_head,
                lr_schedule=lr_schedule, device=cfg.train.device, precision=cfg.train.precision,
                gradient_checkpointing=cfg.train.gradient_checkpointing,
                max_nonfinite_steps=cfg.train.max_nonfinite_steps)


def make_learner(cfg: Any, algo: Any, model: Any, lr_schedule: Any,
                 source: ModelSource | None = None) -> Learner | LearnerGroup:
    """`Learner` in this process (`train.learner_workers=0`) or a `LearnerGroup` of
    `train.learner_workers` ranks, both on `model` (the driver's policy); the ranks load it
    from `source` (its directory) when given, else receive it through the object store."""
    kw = learner_kwargs(cfg, algo, lr_schedule)
    if cfg.train.learner_workers == 0:
        return Learner(model, **kw)
    return LearnerGroup(model, kw, workers=cfg.train.learner_workers,
                        cpus=cfg.train.learner_cpus, gpus=cfg.train.learner_gpus,
                        torch_threads=cfg.train.torch_threads, seed=cfg.seed,
                        ray_address=cfg.rollout.ray_address, source=source,
                        timeout_s=cfg.train.learner_timeout_s)


def _unwrap(e: BaseException) -> BaseException:
    """The exception a rank raised, out of Ray's `RayTaskError` wrapper."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


class LearnerGroup:
    """`workers` learner ranks as Ray actors in a placement group, one `torch.distributed`
    rank each; the driver's side of `agentrl.learner.rank.LearnerRank`.

    Args:
        model: the policy (the driver keeps it as the export copy).
        kwargs: `Learner` keywords (`learner_kwargs`); `device=cuda` (or `auto` with `gpus`)
            puts each rank on its bundle's GPU (`gpus=1`; `agentrl.learner.rank.rank_device`).
        workers, cpus, gpus: ranks, and CPUs / GPUs reserved per rank (placement-group bundles,
            packed on as few nodes as possible).
        torch_threads: torch threads per rank.
        seed: the ranks' torch / numpy / random seed before the model is sharded.
        ray_address: join this Ray cluster (None: a local one, or the one already up).
        source: where each rank loads the policy itself (`ModelSource`: its directory,
            checked against `model`); None: each rank gets `model` through the object store.
        timeout_s: seconds a call to the ranks may take (`LearnerTimeoutError` after; also the
            process group's collective timeout).

    Raises:
        ValueError: `workers < 1`.
        PlacementError: the ranks' bundles could not be placed within `PLACEMENT_TIMEOUT_S`.
    """

    def __init__(self, model: Any, kwargs: dict[str, Any], *, workers: int,
                 cpus: float = 1.0, gpus: float = 0.0, torch_threads: int = 1, seed: int = 0,
                 ray_address: str | None = None, source: ModelSource | None = None,
                 timeout_s: float = 1800.0) -> None:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


        if workers < 1:
            raise ValueError(f"train.learner_workers={workers}: a group needs at least 1 rank")
        ensure_ray(ray_address)
        self.model = model  # the driver's copy: the consolidated export is written from it
        self.algo_state: dict[str, Any] = {}
        self.optimizer_steps = 0
        self.nonfinite_streak = 0
        self.temperature = float(kwargs.get("temperature", 1.0))  # as Learner.temperature
        self.micro_batch_size = int(kwargs.get("micro_batch_size", 16))  # as Learner.micro_batch_size
        self.reference: Any = None  # a RemoteFrozenModel (placement.reference=worker), as on Learner
        self.teacher: Any = None  # distill's teacher (frozen.make_teacher), as on Learner
        self.ref_seconds = 0.0
        bundle: dict[str, float] = {"CPU": float(cpus)}
        if gpus:
            bundle["GPU"] = float(gpus)
        self.pg = placement_group([dict(bundle) for _ in range(workers)], strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self.pg)
            raise PlacementError(
                f"train.learner_workers={workers}: {workers} bundles of {bundle} could not be placed "
                f"in {PLACEMENT_TIMEOUT_S:.0f} s; the Ray cluster has {ray.available_resources()} free. "
                "Lower train.learner_cpus (fractions are allowed), rollout.worker_cpus / "
                "rollout.worker_gpus, or the number of learner or rollout workers (a CUDA "
                "learner rank takes one whole GPU, train.learner_gpus=1)") from None
        actor = ray.remote(LearnerRank)
        self.ranks = [
            actor.options(num_cpus=cpus, num_gpus=gpus, max_concurrency=1,
                          runtime_env={"env_vars": {"OMP_NUM_THREADS": str(torch_threads)}},
                          scheduling_strategy=PlacementGroupSchedulingStrategy(
                              placement_group=self.pg, placement_group_bundle_index=r)
                          ).remote(r, workers, torch_threads)
            for r in range(workers)]
        self.timeout_s = float(timeout_s)
        multi_node = sum(1 for n in ray.nodes() if n.get("Alive")) > 1
        master = ray.get(self.ranks[0].address.remote(multi_node))
        if source is not None and source.fingerprint is None:
            source = dataclasses.replace(source, fingerprint=weights_fingerprint(model))
        sent = source if source is not None else ray.put(model)
        setups = self._all("setup", master, sent, kwargs, seed, gpus, self.timeout_s)
        self.shard_params = [s["params"] for s in setups]  # parameters held by each rank
        self.master, self.devices = master, [s["device"] for s in setups]
        self.setup_rss_mb = [s["rss_mb"] for s in setups]  # (peak before, after) the set-up
        self._lr = setups[0]["lr"]

    # -- plumbing -----------------------------------------------------------------------------
    def _all(self, method: str, *args: Any) -> list[Any]:
        """Call `method` on every rank at once (a collective); their answers in rank order.
        A rank's exception is raised as itself (NonFiniteGradientError, ValueError, ...) as
        soon as it comes, without waiting for the others (which may wait in a collective).

        Raises:
            LearnerTimeoutError: ranks still busy after `timeout_s` (named)."""
        import ray

        refs = [getattr(r, method).remote(*args) for r in self.ranks]
        pending, deadline = list(refs), time.monotonic() + self.timeout_s
        while pending:
            done, pending = ray.wait(pending, num_returns=1,
                                     timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                hung = ", ".join(str(refs.index(p)) for p in pending)
                raise LearnerTimeoutError(
                    f"learner rank(s) {hung} of {len(refs)} did not finish {method!r} within "
                    f"train.learner_timeout_s={self.timeout_s:g} s: a hung collective (a rank that "
                    "died, stopped or stalls) or a call slower than that; raise "
                    "train.learner_timeout_s if the updates are that slow")
            try:
                ray.get(done)
            except ray.exceptions.RayTaskError as e:
                raise _unwrap(e) from None
        return ray.get(refs)

    def _first(self, method: str, *args: Any) -> Any:
        return self._all(method, *args)[0]

    @property
    def world(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    # -- the learner interface ----------------------------------------------------------------
    def update(self, batch: dict[str, Any], algo: Any, cfg: Any, *, epochs: int = 1,
               minibatches: int = 1, seed: int = 0, on_policy_shortcut: bool = True) -> dict[str, float]:
        """`Learner.update` over the ranks (see there); the batch goes once to the object
        store, `algo` (pickled by reference: its module or class is imported on the ranks) with
        every call. Raises `NonFiniteGradientError` as the in-process learner does."""
        import ray

        ref = ray.put(batch)
        out = self._first("update", ref, algo, cfg, epochs, minibatches, seed, on_policy_shortcut)
        self.optimizer_steps = out["optimizer_steps"]
        self.nonfinite_streak = out["nonfinite_streak"]
        self._lr = out["lr"]
        return out["metrics"]

    def logprobs(self, batch: dict[str, Any], *, ref: bool = False) -> torch.Tensor:
        """(B, T) logprobs of the policy (or the reference), without gradient; the reference's
        from the reference worker when `reference` is set (`Learner.logprobs`)."""
        import ray

        if not ref:
            return self._first("logprobs", ray.put(batch), ref)
        t0 = time.perf_counter()
        try:
            if self.reference is not None:
                return self.reference.logprobs(batch)
            return self._first("logprobs", ray.put(batch), ref)
        finally:
            self.ref_seconds += time.perf_counter() - t0

    def logprobs_and_values(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`Learner.logprobs_and_values` over the ranks: logp (B, T), values (B, T), last (B,)."""
        import ray

        return self._first("logprobs_and_values", ray.put(batch))

    @property
    def lr(self) -> float:
        """The learning rate of the next optimizer step."""
        return self._lr

    def state_dict_for_engines(self) -> dict[str, torch.Tensor]:
        """The policy's full weights (plain model names, LoRA merged) on CPU, gathered one
        tensor at a time on the ranks and returned by rank 0."""
        return self._first("state_dict_for_engines")

    def compile_note(self) -> str:
        """Learner ranks run the plain transformers forward: nothing is compiled."""
        return ""

    def fast_path_notes(self) -> list[str]:
        """What the ranks do differently from the in-process learner."""
        return [f"train.learner_workers={self.world}: {self.world} FSDP2 rank(s) run the plain "
                "transformers forward (no prompt sharing, static decoder or torch.compile)"]

    # -- checkpoints ----------------------------------------------------------------------------
    def save(self, path: str | Path, tokenizer: Any, extra: dict[str, Any],
             files: dict[str, bytes] | None = None) -> Path:
        """Write a checkpoint atomically (a temp dir renamed into place; module doc): the
        consolidated export, the ranks' DCP shards, scheduler / step / RNG, `algo_state`,
        `extra` (step, policy version), `files` (name -> bytes, covered by the manifest)."""
        full = self._first("export_state")
        export = copy.deepcopy(self.model)
        export.load_state_dict(full["policy"])
        state = {**self._first("trainer_state"), "learner_workers": self.world, **rng_state()}
        return write_checkpoint(path, export, tokenizer, trainer_state=state, algo_state=self.algo_state,
                                extra=extra, files=files, value_head=full.get("value_head"),
                                sharded=lambda tmp: self._all("save", str(tmp)))

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore a checkpoint written by a group of any size (DCP reshards); returns
        `extra`.

        Raises:
            ValueError: the checkpoint was written by the in-process learner
                (`train.learner_workers=0`: no sharded state; resume it with 0 workers).
        """
        path = Path(path)
        if not (path / SHARDED).is_dir():
            raise ValueError(f"{path} was written by the in-process learner (train.learner_workers=0): "
                             f"it has no sharded state ({SHARDED}/) for learner ranks; resume it with "
                             "train.learner_workers=0")
        st = read_state(path, TRAINER_STATE)
        self._all("load", str(path), st["scheduler"], st["optimizer_steps"])
        self.optimizer_steps = int(st["optimizer_steps"])
        self._lr = float(st["scheduler"]["_last_lr"][0])  # LambdaLR's state: the next step's lr
        set_rng_state(st)
        algo_state = read_state(path, ALGO_STATE)
        if algo_state is not None:
            self.algo_state = algo_state
        return read_state(path, RUN_STATE)

    def shutdown(self) -> None:
        """Stop the ranks and free the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        try:  # bounded: after a signal to the whole process group Ray itself may be gone
            ray.get([r.shutdown.remote() for r in self.ranks], timeout=SHUTDOWN_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a dead rank or cluster: kill below
            pass
        try:
            for r in self.ranks:
                ray.kill(r)
            remove_placement_group(self.pg)
        except Exception:  # noqa: BLE001 - the cluster is down: nothing left to free
            pass
