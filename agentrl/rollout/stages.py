"""The collection side of the training loop (`agentrl.train.train`): what its stages share
(`Loop`), the batch of a step (`run_batch`: task seeds drawn from (seed, step), each task run
`group_size` times), refills for dynamic sampling (`refill`), where batches come from
(`make_source`: sampled on demand, or by actor threads ahead of the learner, with
`rollout.partial` pushes landing inside generations), the staleness filter (`drop_stale`, per
token) and the weight push (`sync`).

An algorithm may mix in a second sampler (distill's GKD mixture: `Loop.mixture_engine` plays
some of each step's tasks); the loop reaches the algorithm only through its declared needs and hooks (`agentrl.algos.base.Algorithm`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.algos.shaping import build_batch
from agentrl.config import Config
from agentrl.log.metrics import MetricsLog
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.collect import collect
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.source import AsyncSource, Leases, SyncSource
from agentrl.types import Trajectory


@dataclass
class Loop:
    """What the stages of one run share. `engine` is the rollout engine (an in-process engine
    behind `LockedEngine`, or a `RolloutPool`), entered under `lock` by evaluation, refills and
    weight updates; `env_sets` leases each batch in flight its own train envs and thread pool;
    `eval_envs` + `pool` run the held-out evaluation; `new_env(split)` makes one env with the
    run's shared reward wrappers (to replace one whose call timed out), `rewards` those
    wrappers (the driver's; Ray workers and vLLM hold their own); `version` is the learner's
    policy version."""

    cfg: Config
    out: Path
    say: Callable[[str], None]
    algo: Any
    model: Any
    tok: Any
    renderer: ChatRenderer
    pad_id: int
    learner: Any
    engine: Any
    lock: threading.RLock
    env_sets: Leases
    eval_envs: list[Any]
    pool: ThreadPoolExecutor
    params: SamplingParams
    log: MetricsLog
    new_env: Callable[[str], Any]
    start_step: int = 0
    version: int = 0
    rewards: Any = None  # the driver's `RewardWrappers` (None without env.wrappers)
    source_start: int = 0  # the first step of the current batch source (`make_source`)
    reporter: Any = None
    """Where stage progress goes (`agentrl.log.progress.Reporter`)."""
    mixture_engine: Any = None
    """A second sampler that plays some of each step's tasks (distill's GKD mixture,
    `algo.distill_teacher_fraction > 0`: an in-process engine behind `LockedEngine` with the
    frozen teacher's weights, `agentrl.run.teacher_engine`); None for most runs."""
    mixture_envs: list[Any] | None = None
    """The train envs the second sampler's episodes run in (its tasks x group_size of them)."""
    workers_alive: float | None = None
    """Ray rollout workers alive at the last step (`worker_health`); None before the first."""


def task_seeds(cfg: Config, *key: int) -> list[int]:
    """`rollout.tasks_per_step` task seeds drawn from the generator seeded `[cfg.seed, *key]`."""
    rng = np.random.default_rng([cfg.seed, *key])
    return [int(s) for s in rng.integers(0, 2**31 - 1, size=cfg.rollout.tasks_per_step)]


def held_version(lp: Loop) -> int:
    """The policy version of the weights the engine holds."""
    return int(lp.engine.version if hasattr(lp.engine, "run") else lp.engine.policy_version)


def apply_weights(lp: Loop, state_dict: dict[str, Any], v: int) -> None:
    """Load weights `v` into the engine, unless it already holds newer ones (an older push
    applied late in async mode); never while evaluation or a refill is sampling."""
    with lp.lock:
        if v < held_version(lp):
            return
        lp.engine.update_weights(state_dict, v)


def run_batch(lp: Loop, step: int) -> list[Trajectory]:
    """Batch `step`: `tasks_per_step` task seeds drawn from (seed, step), so a resumed or
    asynchronous run samples the same tasks; each task run `group_size` times. With a second
    sampler (`lp.mixture_engine`, distill's GKD mixture) the last of the tasks are played by it
    (its episodes passed to the algorithm's `mark_mixture_rows` hook), after the policy's,
    group-major as well."""
    cfg = lp.cfg
    seeds = task_seeds(cfg, step)
    n_s = len(seeds) - len(lp.mixture_envs or []) // cfg.algo.group_size  # the policy's tasks
    with lp.env_sets.lease() as (envs_, pool_):  # several batches may be in flight
        trajs = collect(lp.engine, lp.renderer, envs_, seeds[:n_s], cfg.algo.group_size,
                        lp.params, cfg, pool_, group_base=step * cfg.rollout.tasks_per_step,
                        sample_seed=cfg.seed * 100_003 + step,
                        make_env=partial(lp.new_env, "train")) if n_s else []
        if n_s < len(seeds):  # the second sampler plays the other tasks
            other = collect(lp.mixture_engine, lp.renderer, lp.mixture_envs, seeds[n_s:], cfg.algo.group_size,
                            lp.params, cfg, pool_, group_base=step * cfg.rollout.tasks_per_step + n_s,
                            sample_seed=(cfg.seed * 100_003 + step) * 31 + 7,
                            make_env=partial(lp.new_env, "train"))
            lp.algo.mark_mixture_rows(other, held_version(lp))
            trajs = trajs + other
    prefetch_reference(lp, trajs)
    return trajs


def frozen_workers(learner: Any) -> list[Any]:
    """The learner's frozen-model workers (`agentrl.learner.frozen.RemoteFrozenModel`): the
    reference's (`placement.reference=worker`) and the teacher's (`placement.teacher=worker`),
    those that are set (an inline teacher, `on_worker` False, is none)."""
    return [w for w in (getattr(learner, "reference", None), getattr(learner, "teacher", None))
            if w is not None and w.on_worker]


def prefetch_reference(lp: Loop, trajs: list[Trajectory]) -> None:
    """The pipeline (`placement.reference=worker`, `placement.teacher=worker`): start the
    reference's and the teacher's logprobs of a batch on their workers as soon as it is
    sampled, without waiting. In sync mode they overlap the rest of the step up to the point
    the loop needs them (the rollout metrics, collation and the algorithm's own policy pass);
    in async mode this runs on the actor thread, so the logprobs of batch s+1 overlap the
    learner's update of batch s. The loop's `learner.logprobs(batch, ref=True)` (and the
    algorithm's `prepare`) takes the result when its batch has the same rows
    (`agentrl.learner.frozen.batch_key`); when dynamic sampling or the staleness filter changed the
    rows, it is computed then."""
    workers = frozen_workers(lp.learner)
    if workers and trajs and not lp.cfg.algo.dynamic_sampling:
        batch = build_batch(trajs, lp.pad_id)
        for w in workers:
            w.prefetch(batch)


def refill(lp: Loop, step: int, r: int) -> list[Trajectory]:
    """Fresh groups for refill round r (1, 2, ...) of dynamic sampling at `step`."""
    cfg = lp.cfg
    with lp.lock, lp.env_sets.lease() as (envs_, pool_):  # async actors use the engine too
        return collect(lp.engine, lp.renderer, envs_, task_seeds(cfg, step, r), cfg.algo.group_size,
                       lp.params, cfg, pool_,
                       group_base=(step + r * cfg.train.steps) * cfg.rollout.tasks_per_step,
                       sample_seed=(cfg.seed * 100_003 + step) * 31 + r, make_env=partial(lp.new_env, "train"))


def source_end(cfg: Config, start: int) -> int:
    """The step before which an async source started at `start` stops sampling: the next
    checkpoint step (`train.save_every`), or the last step."""
    every = cfg.train.save_every
    return min(cfg.train.steps, (start // every + 1) * every) if every else cfg.train.steps


def actor_threads(cfg: Any) -> int:
    """Actor threads of an async run: `rollout.batches_in_flight`, at most
    `train.max_staleness + 1` (batch `s` waits for version `s - max_staleness`, so with version
    `v` only batches `v .. v + max_staleness` can sample at once: more threads would only wait
    at the gate, each holding its own env set). With the defaults (`max_staleness=0`,
    `batches_in_flight=2`): 1, and the batches are the sync loop's either way
    (`agentrl.rollout.source`); the run used to warn about the idle thread on every async run
    with the defaults."""
    return max(1, min(int(cfg.rollout.batches_in_flight), int(cfg.train.max_staleness) + 1))


def make_source(lp: Loop, start: int) -> Any:
    """Where batches `start, start+1, ...` come from: sampled on demand (sync), or by actor
    threads that sample ahead with bounded staleness (async), up to the next checkpoint step
    only (`source_end`): at each checkpoint the pipeline is drained and a new source starts
    from the checkpoint's weights (`restart_source`), exactly as `--resume` does, so that a
    resumed async run samples what the uninterrupted one did (docs/observability.md)."""
    cfg = lp.cfg
    lp.source_start = start
    batch = lambda step: run_batch(lp, step)  # noqa: E731
    apply = lambda sd, v: apply_weights(lp, sd, v)  # noqa: E731
    if cfg.rollout.mode == "async":
        remote = cfg.rollout.partial and ray_workers(lp.engine)  # they stage pushes themselves
        src = AsyncSource(batch, apply, start=start, version=lp.version,
                          max_staleness=cfg.train.max_staleness, queue_size=cfg.rollout.queue_size,
                          batches_in_flight=actor_threads(cfg), end=source_end(cfg, start),
                          push_through=remote)
        if cfg.rollout.partial and not remote:  # pushes land at the engine's next token boundary
            inner(lp.engine).weight_poll = partial(poll_weights, lp, src)
        return src
    return SyncSource(batch, apply)


def poll_weights(lp: Loop, source: AsyncSource) -> bool:
    """The engine's `weight_poll` with `rollout.partial`: apply the newest pushed weights now
    (`AsyncSource.poll_weights`); True when the engine's version changed (a push older than
    the weights it holds, e.g. after an evaluation loaded the newest, changes nothing).

    The run's lock is only tried: with an in-process `RolloutPool` (vLLM) the generating thread
    holds the worker's engine lock, not the run's, and evaluation or a refill holding the run's
    lock while it waits for the worker's would otherwise deadlock with it. (The HF engine's
    generating thread already holds the run's lock: `LockedEngine`.)"""
    if not lp.lock.acquire(blocking=False):  # evaluation or a refill holds it: the next boundary
        return False
    try:
        before = held_version(lp)
        return source.poll_weights() and held_version(lp) != before
    finally:
        lp.lock.release()


def ray_workers(engine: Any) -> bool:
    """Whether `engine` is a `RolloutPool` of Ray workers (whose engines are in other processes:
    with `rollout.partial` each worker stages a push and loads it at its engine's next token
    boundary, `agentrl.rollout.worker_weights`)."""
    return hasattr(engine, "run") and getattr(engine, "local_engine", None) is None


def inner(engine: Any) -> Any:
    """The engine behind a `LockedEngine`, the in-process engine of a `RolloutPool` without Ray
    workers (vLLM in this process), or `engine` itself.

    Raises:
        ValueError: it has no `weight_poll` (partial rollouts need an HF or vLLM engine on a
            text model, in this process or, HF, on Ray workers).
    """
    e = getattr(engine, "local_engine", None) or getattr(engine, "engine", engine)
    if not hasattr(e, "weight_poll"):
        raise ValueError(f"rollout.partial=true needs an HF or vLLM engine on a text model; "
                         f"{type(e).__name__} does not interrupt generations (set rollout.partial=false)")
    return e


def restart_source(lp: Loop, source: Any, start: int) -> Any:
    """After the checkpoint of step `start` (async): stop the drained source (it sampled no
    batch from `start` on), load the learner's weights into the engine (the actor may hold an
    older version) and start a new source at `start`: what `--resume` builds from that
    checkpoint."""
    source.close()
    if lp.cfg.rollout.partial and not ray_workers(lp.engine):
        inner(lp.engine).weight_poll = None
    apply_weights(lp, lp.learner.state_dict_for_engines(), lp.version)
    return make_source(lp, start)


def drop_stale(lp: Loop, trajs: list[Trajectory], m: dict[str, float]) -> list[Trajectory]:
    """The trajectories fresh enough to train on (their oldest token at most
    `train.max_staleness` versions behind the learner), over every fresh episode sampled for the
    step; records in `m` the batch's `perf/env_s` and `perf/generate_s` (summed over episodes),
    `rollout/staleness_max` and the histogram `async/staleness_<k>` (per episode, of its oldest
    token), `rollout/staleness_tokens_mean` / `_max` (per sampled token) and
    `rollout/dropped_stale`."""
    m["perf/env_s"] = float(sum(t.timings.get("env", 0.0) for t in trajs))
    m["perf/generate_s"] = float(sum(t.timings.get("generate", 0.0) for t in trajs))
    per_token = [lp.version - v for t in trajs for v in t.sampled_versions()]
    m["rollout/staleness_tokens_mean"] = float(np.mean(per_token)) if per_token else 0.0
    m["rollout/staleness_tokens_max"] = float(max(per_token, default=0))
    stale = [lp.version - t.oldest_version for t in trajs]
    m["rollout/staleness_max"] = float(max(stale))
    for k in range(max(stale) + 1):  # staleness histogram (versions behind the learner)
        m[f"async/staleness_{k}"] = float(stale.count(k))
    trajs = [t for t, s in zip(trajs, stale) if s <= lp.cfg.train.max_staleness]
    m["rollout/dropped_stale"] = float(len(stale) - len(trajs))
    return trajs


def pool_health(pool: Any) -> dict[str, float]:
    """The Ray rollout workers' state as step metrics: `rollout/workers_alive` (workers Ray has
    not given up on; one past `rollout.max_restarts` restarts, or not back within
    `restart_timeout_s`, is dead for the rest of the run and its shards go to the others) and
    `rollout/reissued` (shards re-issued after a worker died, since the pool started). Empty
    for an engine in this process or a `RolloutPool` with `num_workers=0` (no Ray workers)."""
    if not getattr(pool, "num_workers", 0):
        return {}
    return {"rollout/workers_alive": float(sum(pool.alive)),
            "rollout/reissued": float(pool.stats["reissued"])}


def worker_health(lp: Loop, m: dict[str, float]) -> None:
    """The Ray rollout workers' metrics (`pool_health`: `rollout/workers_alive`,
    `rollout/reissued`) into `m`, and one line when Ray gave up on a worker since the last
    step (the pool goes on without it; before, only Ray's own `(raylet) A worker died` line
    said so). Nothing for an engine in this process."""
    health = pool_health(lp.engine)
    m.update(health)
    alive = health.get("rollout/workers_alive")
    if alive is not None and lp.workers_alive is not None and alive < lp.workers_alive:
        lp.say(f"[workers] {lp.workers_alive - alive:g} rollout worker(s) died and Ray gave up on them "
               f"(rollout.max_restarts={lp.cfg.rollout.max_restarts}): sampling goes on with "
               f"{alive:g} of {lp.cfg.rollout.num_workers} workers")
    lp.workers_alive = alive


def sync(lp: Loop, source: Any, step: int, m: dict[str, float]) -> None:
    """Bump the policy version and push the new weights to the engine (every step in sync
    mode, every `rollout.sync_every` steps of the current source in async mode, counted from
    its start, so that a resumed run pushes at the same steps); `perf/sync_s` seconds (gathering
    from learner ranks included) and `perf/sync_mb` MiB per push."""
    t0 = time.perf_counter()
    lp.version += 1
    if lp.cfg.rollout.mode == "sync" or (step + 1 - lp.source_start) % lp.cfg.rollout.sync_every == 0:
        sd = lp.learner.state_dict_for_engines()
        source.push_weights(sd, lp.version)
        m["perf/sync_mb"] = sum(v.numel() * v.element_size() for v in sd.values()) / 2**20
    m["perf/sync_s"] = time.perf_counter() - t0


def shut_down(lp: Loop) -> None:
    """Close the metrics log, the env sets' thread pools and the engine."""
    lp.log.close()
    for _, p_ in lp.env_sets.items:
        p_.shutdown()
    if hasattr(lp.engine, "shutdown"):
        lp.engine.shutdown()
