"""Rollout workers: the agent loop run by N Ray actors, each holding an engine and its envs.

    driver (RolloutPool)                         Ray actors (RolloutWorker x N)
    run(specs, params, seed) ── shard by group ─▶ run_episodes(engine, envs, shard, seed,
                               (+ earlier shards)     seed_offsets of the earlier shards)
            ◀── trajectories (object store) ─────
    update_weights(sd, v) ── ray.put(sd) once ──▶ engine.update_weights(sd, v)  (all workers)

`RolloutWorker` is a plain class: `RolloutPool(num_workers=0)` runs the very same code in this
process (a breakpoint works), and Ray wraps the same class as an actor for `num_workers >= 1`.

Sampling streams: in one process the whole batch is one `run_episodes` call, where a row's seed
counts the rows with the same prompt before it (`row_seeds`), so repeated prompts (a group, or
two groups of the same task) sample differently. A worker gets the specs of the earlier shards
too, resets a probe env with each of their reset kwargs to learn their opening prompts, and
starts its own count of each prompt where the earlier shards' ends (`seed_offsets`): its first
turn samples exactly what the in-process call samples, whatever the sharding. Later turns are
counted within the worker; they match the in-process call too unless two episodes on different
workers reach the same context (the same opening prompt and identical turns so far), which then
share that turn's seed (in one process they would not).

Failure isolation: actors are created with `max_restarts`; when a worker dies in the middle of a
step (killed, OOM, a segfaulting extension), the pool re-issues that worker's whole shard (to the
restarted actor first, then to the others) with the same seed, so the step still returns one
trajectory per spec. A restarted actor comes back with the initial weights; every `run` call
carries the latest weights' object ref, and a worker holding an older push loads them first.

Batches in flight (`rollout.mode=async`, `rollout.batches_in_flight=N`): the driver calls `run`
from N actor threads at once, so the actors are threaded (`max_concurrency=N+2`: N runs, plus
a weight push and an evaluation or a `ready` probe that never wait behind them). Inside a worker
each `run` leases its own env instances and thread pool, and the engine is entered by one
`generate` or `update_weights` at a time (`LockedEngine`): one batch generates while another's
envs step, and a push lands between two generate calls (`rollout.partial`: at a token boundary).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from agentrl.config import Config, ConfigError
from agentrl.infra.cluster import ensure_ray  # (also imported from here by callers)
from agentrl.rewards import RewardWrappers
from agentrl.rollout.agent_loop import EpisodeSpec, opening_prompt, run_episodes
from agentrl.rollout.chat import renderer_for
from agentrl.rollout.collect import sampling_specs
from agentrl.rollout.engines.base import SamplingParams, prompt_key
from agentrl.rollout.engines.make import make_engine, rollout_device
from agentrl.rollout.envs import (
    add_folders,
    build_env,
    unimportable,
    user_module_folders,
    user_modules,
)
from agentrl.rollout.source import Leases, LockedEngine
from agentrl.rollout.worker_weights import StagedPushes, catch_up
from agentrl.types import Trajectory


def worker_concurrency(cfg: Config) -> int:
    """Calls a worker actor runs at once: 1 in sync mode (Ray's default actor); in async mode
    `batches_in_flight` runs + 2 (a weight push, and an evaluation, refill or `ready` probe)."""
    if cfg.rollout.mode != "async":
        return 1
    return int(cfg.rollout.batches_in_flight) + 2


def shard_specs(specs: Sequence[EpisodeSpec], num_shards: int) -> list[list[int]]:
    """Split spec indices into `num_shards` contiguous, balanced shards, never splitting a group.

    Groups are the specs sharing a `group_id`, in order of first appearance; a group goes to
    shard `floor(start * num_shards / len(specs))`, where `start` is the number of specs in the
    groups before it. With equal groups this deals `ceil`/`floor` groups per shard, e.g.
    5 groups of 2 into 2 shards: starts 0,2,4,6,8 -> shards 0,0,0,1,1 (6 and 4 specs).

    Returns:
        `num_shards` lists of indices into `specs` (some empty when there are fewer groups than
        shards); each group's indices stay in their original order and in one shard.

    Raises:
        ValueError: if `num_shards < 1`.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(specs):
        groups.setdefault(s.group_id, []).append(i)
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    start = 0
    for members in groups.values():
        shards[min(num_shards - 1, start * num_shards // len(specs))].extend(members)
        start += len(members)
    return shards


class RolloutWorker:
    """An engine, a chat renderer and a pool of env instances per split; runs the agent loop.

    The same class runs in-process and as a Ray actor (`RolloutPool`). On a vision-language
    model directory the engine is a `VisionHFEngine` and the renderer a `VisionChatRenderer`:
    each trajectory's `vision` (pixel values, image grid, placeholder spans: CPU tensors) goes
    back to the driver with it through Ray's object store.

    Args:
        cfg: the run's config (`rollout.*` for the engine, threads and limits; `env.*` for envs).
        model_path: local Hugging Face model directory the engine starts from (version 0).
        worker_id: index of this worker (recorded in `Trajectory.info["rollout_worker"]`).
        env_factory: `split -> env`; default `agentrl.rollout.envs.build_env(cfg, split, rewards)`
            with one `RewardWrappers` per worker (state such as a curiosity memory or a safety
            multiplier is shared by the worker's envs, not across workers).
        gpus: the GPUs Ray reserved for this worker (`rollout.worker_gpus`); None in the driver
            process. The hf engine's device is `rollout_device(cfg, worker_gpus=gpus)`: a worker
            that reserves a GPU samples on it.
        sys_path: folders for `sys.path`: where the driver found the user's modules (`add_folders`).
        stage_pushes: partial rollouts: a push lands at a token boundary (`worker_weights`).
    """

    def __init__(self, cfg: Config, model_path: str | Path, *, worker_id: int = 0,
                 env_factory: Callable[[str], Any] | None = None, gpus: float | None = None,
                 sys_path: Sequence[str] = (), stage_pushes: bool = False) -> None:
        import torch

        add_folders(tuple(sys_path))
        torch.set_num_threads(cfg.rollout.torch_threads)
        self.cfg = cfg
        self.worker_id = worker_id
        device = rollout_device(cfg, worker_gpus=gpus) if cfg.rollout.engine == "hf" else None
        self.engine, tokenizer = make_engine(cfg, model_path, device=device)
        # a vision-language directory's renders images
        self.renderer = renderer_for(tokenizer, cfg.rollout.history, cfg.rollout.chat_template_kwargs)
        self.push_id = 0  # which `RolloutPool` push the engine holds (0: the model directory's)
        self._env_factory = env_factory
        self._rewards: Any = None  # the worker's `RewardWrappers` when `env.wrappers` is set
        self._envs: dict[str, list[Any]] = {}
        self._threads = ThreadPoolExecutor(max_workers=cfg.rollout.env_threads)
        # concurrent `run` calls (batches in flight): one generate / weight load at a time, and
        # an env set + thread pool per call (the first set is `envs(split)` with `_threads`)
        self._lock = threading.RLock()
        self._env_lock = threading.Lock()
        self._sets: dict[str, Leases] = {}
        self._probes: dict[str, Any] = {}  # split -> env reset to learn opening prompts
        self._probe_lock = threading.Lock()
        self.staged = StagedPushes(self) if stage_pushes else None  # partial rollouts (sets weight_poll)

    def _ensure_rewards(self) -> Any:
        """The worker's `RewardWrappers` (made on first need; None without `env.wrappers` or
        with a custom `env_factory`). Call under `_env_lock`."""
        if self._env_factory is None and self.cfg.env.wrappers and self._rewards is None:
            # one per worker: its env copies share judge client, curiosity memory, multiplier
            self._rewards = RewardWrappers.from_config(self.cfg)
        return self._rewards

    def _make_env(self, split: str) -> Any:
        if self._env_factory is not None:
            return self._env_factory(split)
        return build_env(self.cfg, split, self._ensure_rewards())

    def reward_state(self) -> dict[str, Any] | None:
        """The state of this worker's reward wrappers (`RewardWrappers.state_dict`; None when
        it has none), for the run's checkpoint."""
        with self._env_lock:
            rewards = self._ensure_rewards()
        return rewards.state_dict() if rewards is not None else None

    def load_reward_state(self, state: dict[str, Any] | None) -> list[str]:
        """Restore `reward_state()`'s state (on resume, before any episode); returns the notes
        of `RewardWrappers.load_state_dict` (and one when the worker has no wrappers)."""
        with self._env_lock:
            rewards = self._ensure_rewards()
        if state is None:
            return ["the reward wrappers start from their initial state: the checkpoint has none"] \
                if rewards is not None else []
        if rewards is None:
            return ["the saved reward wrapper state is not used: this run has no env.wrappers"]
        return rewards.load_state_dict(state)

    def _new_env(self, split: str) -> Any:
        """One more env of `split` (e.g. to replace one whose call timed out)."""
        with self._env_lock:  # `_make_env` creates the shared reward wrappers once
            return self._make_env(split)

    def opening_counts(self, specs: Sequence[EpisodeSpec], split: str = "train") -> dict[bytes, int]:
        """How many of `specs` sampling their first turn (`sampling_specs`) open with each prompt
        (`prompt_key`) in `run_episodes`' first generate call (`opening_prompt`): one probe env reset
        per distinct reset kwargs (an env's opening is a function of them, as reproducibility needs)."""
        counts: dict[bytes, int] = {}
        known: dict[str, list[int] | None] = {}
        with self._probe_lock:
            for spec in sampling_specs(specs):
                kw = json.dumps(spec.reset_kwargs, sort_keys=True, default=repr)
                if kw not in known:
                    probe = self._probes.get(split)
                    if probe is None:
                        probe = self._new_env(split)
                    known[kw], timed_out = opening_prompt(
                        probe, self.renderer, spec.reset_kwargs,
                        max_episode_tokens=self.cfg.rollout.max_episode_tokens,
                        reset_timeout_s=self.cfg.env.reset_timeout_s)
                    self._probes[split] = None if timed_out else probe  # never reused after
                ids = known[kw]
                if ids is not None:
                    counts[prompt_key(ids)] = counts.get(prompt_key(ids), 0) + 1
        return counts

    def _fill(self, pool: list[Any], split: str, n: int) -> list[Any]:
        """Append env instances of `split` to `pool` until it holds `n`; returns `pool`."""
        with self._env_lock:  # `_make_env` creates the shared reward wrappers once
            while len(pool) < n:
                pool.append(self._make_env(split))
            return pool

    def envs(self, split: str, n: int) -> list[Any]:
        """At least `n` env instances of `split` (made on first need, reused afterwards)."""
        with self._env_lock:
            pool = self._envs.setdefault(split, [])
        return self._fill(pool, split, n)

    def _env_sets(self, split: str) -> Leases:
        """The `(envs, thread pool)` sets of `split`, one per concurrent `run`; the first set
        is `envs(split)` with the worker's pool."""
        with self._env_lock:
            if split not in self._sets:
                self._sets[split] = Leases(
                    lambda: ([], ThreadPoolExecutor(max_workers=self.cfg.rollout.env_threads)),
                    [(self._envs.setdefault(split, []), self._threads)])
            return self._sets[split]

    def ready(self) -> dict[str, Any]:
        """Process id, policy version, stop ids, the user's modules it cannot import: a cheap call."""
        who = f"rollout worker {self.worker_id} (pid {os.getpid()})"
        return {"pid": os.getpid(), "worker_id": self.worker_id, "policy_version": self.engine.policy_version,
                "stop_ids": self.renderer.stop_ids, "unimportable": unimportable(user_modules(self.cfg), who)}

    def policy_version(self) -> int:
        """Version of the weights the engine holds."""
        return int(self.engine.policy_version)

    def update_weights(self, state_dict: dict[str, Any], version: int,
                       push_id: int | None = None) -> float:
        """Load a full state dict into the engine as `version`; returns the seconds it took.
        `push_id` numbers the pool's pushes (so a restarted worker knows it missed one, even
        when the version number did not change, e.g. SFT weights pushed as version 0). With
        `stage_pushes` a numbered push lands at the next token boundary (`worker_weights`)."""
        if self.staged is not None and push_id is not None:
            return self.staged.push(state_dict, version, push_id)
        t0 = time.perf_counter()
        with self._lock:  # between two generate calls of the runs in flight
            self.engine.update_weights(state_dict, version)
            if push_id is not None:
                self.push_id = push_id
        return time.perf_counter() - t0

    def run(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int | None = None,
            *, split: str = "train", weights: Sequence[Any] | None = None,
            before: Sequence[EpisodeSpec] = (), one_per_run: bool = False) -> list[Trajectory]:
        """Run `specs` concurrently with `run_episodes` on this worker's envs of `split`, with
        the run's env time limits (`env.step_timeout_s`, `env.reset_timeout_s`; an env whose
        call timed out is replaced by a fresh one). An env with the `run_agents` hook (the
        user's agent, `agentrl.gateway.agents`) runs the specs itself instead: the gateway in
        this process, sampling from this worker's engine (`_run_agents`).

        Args:
            specs: the episodes (one env instance each).
            params: sampling settings (`n` must be 1).
            seed: base sampling seed (turn k uses `seed + k`).
            split: env split (`"train"`, `"heldout"`).
            weights: `[push_id, version, object_ref_of_state_dict]` of the pool's newest push:
                loaded first when the engine holds another push (a restarted actor starts from
                the model directory). The ref is nested in a list so that Ray does not fetch it
                unless it is needed.
            before: the specs of the batch that come before `specs` (the earlier shards): their
                opening prompts are counted (`opening_counts`) so that `specs` get the sampling
                seeds of the whole batch in one call (module doc).
            one_per_run: the `run_agents` hook's flag (evaluation: one trajectory per spec);
                without it a user's agent run that rewrote its context gives several.

        Returns:
            One trajectory per spec, in order (see `run_episodes`); for a user's agent without
            `one_per_run`, each spec's trajectories in spec order (one or more per spec).
        """
        catch_up(self, weights)  # the pool's newest push (and a staged one), before any episode
        if self._is_agent_env(split):
            return self._run_agents(specs, params, seed, split, len(before), one_per_run)
        offsets = self.opening_counts(before, split) if before and seed is not None else None
        with self._env_sets(split).lease() as (envs, threads):
            trajs = run_episodes(LockedEngine(self.engine, self._lock), self.renderer,
                                 self._fill(envs, split, len(specs)), specs, params,
                                 max_episode_tokens=self.cfg.rollout.max_episode_tokens,
                                 executor=threads, seed=seed, seed_offsets=offsets,
                                 step_timeout_s=self.cfg.env.step_timeout_s,
                                 reset_timeout_s=self.cfg.env.reset_timeout_s,
                                 make_env=partial(self._new_env, split))
        for tr in trajs:
            tr.info["rollout_worker"] = self.worker_id
        return trajs

    def _is_agent_env(self, split: str) -> bool:
        """Whether this worker's envs of `split` run their episodes through the gateway
        (the `run_agents` hook of `agentrl.gateway.agents.AgentEnv`)."""
        env = self.envs(split, 1)[0]
        return hasattr(getattr(env, "unwrapped", env), "run_agents")

    def _run_agents(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int | None,
                    split: str, n_before: int, one_per_run: bool) -> list[Trajectory]:
        """The user's agent for `specs`: the env's `run_agents` on a leased env instance, its
        gateway (this process's, on 127.0.0.1) sampling from this worker's engine behind the
        engine lock (a weight push lands between two generate calls). The sampler seed is
        `seed + 104729 * n_before` (`n_before`: the specs of the earlier shards), so that two
        workers' sessions never share a stream. Agent errors and hangs are the runs' own
        recorded errors (`run_agents`); the gateway's per-run tokens are as in one process."""
        if seed is not None and n_before:
            seed = seed + 104729 * n_before
        with self._env_sets(split).lease() as (envs, _threads):
            env = self._fill(envs, split, 1)[0]
            trajs = getattr(env, "unwrapped", env).run_agents(
                LockedEngine(self.engine, self._lock), self.renderer, list(specs), params,
                max_episode_tokens=self.cfg.rollout.max_episode_tokens, seed=seed,
                timeout_s=self.cfg.env.step_timeout_s, one_per_run=one_per_run)
        for tr in trajs:
            tr.info["rollout_worker"] = self.worker_id
        return trajs


class RolloutPool:
    """N rollout workers behind the two calls the training loop needs: `run` and `update_weights`.

    Args:
        cfg: the run's config. Read: `rollout.num_workers` (unless `num_workers` is given),
            `rollout.engine`, `rollout.torch_threads`, `rollout.env_threads`,
            `rollout.max_episode_tokens`, and when present `rollout.ray_address`,
            `rollout.worker_cpus` (default 1), `rollout.worker_gpus` (default 0),
            `rollout.max_restarts` (default 3).
        model_path: model directory every worker's engine starts from (version 0).
        num_workers: override of `cfg.rollout.num_workers`; 0 runs one `RolloutWorker` in this
            process (no Ray).
        env_factory: `split -> env` for every worker (default: `build_env(cfg, split)`); with Ray
            it is pickled, so it must be importable or picklable by value.
        runtime_env: Ray runtime env of the worker actors (e.g. `{"env_vars": {...}}`).
        restart_timeout_s: how long `run` waits for a dead worker's restart before it gives
            that worker up and re-issues its shard to another one.
        worker_cls: the worker class (default `RolloutWorker`; a subclass adds instrumentation,
            e.g. `benchmarks/rollout_overhead.py`'s recorder of generate calls).

    Attributes:
        version: policy version of the last `update_weights` (0 before any).
        stats: counters and timings of the last calls: `sync_s` (driver wall time of the last
            weight push), `put_s` (its `ray.put`), `load_s_max` (slowest worker's load),
            `reissued` (shards re-issued after a worker died, since start), `run_s`.

    Raises:
        ray exceptions: a worker that fails to start (bad model path, engine error) fails here.
    """

    def __init__(self, cfg: Config, model_path: str | Path, *, num_workers: int | None = None,
                 env_factory: Callable[[str], Any] | None = None,
                 runtime_env: dict[str, Any] | None = None,
                 restart_timeout_s: float = 300.0, worker_cls: type | None = None) -> None:
        worker_cls = RolloutWorker if worker_cls is None else worker_cls
        self.cfg = cfg
        self.restart_timeout_s = restart_timeout_s
        self.num_workers = cfg.rollout.num_workers if num_workers is None else num_workers
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        self.version = 0
        self.stats: dict[str, float] = {"reissued": 0.0}
        self._weights_ref: Any = None
        self._push_id = 0
        self._latest: list[Any] | None = None  # [push_id, version, ref], replaced in one step
        self._local: RolloutWorker | None = None
        self.workers: list[Any] = []
        self.alive: list[bool] = []
        if self.num_workers == 0:
            self._local = worker_cls(cfg, model_path, env_factory=env_factory)
            return
        import ray

        ensure_ray(cfg.rollout.ray_address)
        actor = ray.remote(worker_cls).options(
            max_concurrency=worker_concurrency(cfg),  # batches in flight (async mode)
            num_cpus=cfg.rollout.worker_cpus,
            num_gpus=cfg.rollout.worker_gpus,
            max_restarts=cfg.rollout.max_restarts,
            max_task_retries=0,  # the pool re-issues a dead worker's shard itself
            runtime_env=runtime_env,
        )
        folders = user_module_folders(cfg)  # the user's modules, imported there as here
        self.workers = [actor.remote(cfg, str(model_path), worker_id=i, env_factory=env_factory,
                                     gpus=cfg.rollout.worker_gpus, sys_path=folders,
                                     stage_pushes=cfg.rollout.partial)
                        for i in range(self.num_workers)]
        self.alive = [True] * self.num_workers
        bad = [b for r in ray.get([w.ready.remote() for w in self.workers]) for b in r["unimportable"]]
        if bad:  # before any step: one line (it was Ray's tracebacks at the first env build)
            self.shutdown()
            raise ConfigError(f"config error: {bad[0]}; make it importable there (PYTHONPATH, or pip install "
                              f"it; the driver's folders of the user's modules: {', '.join(folders) or 'none'})")

    @property
    def local_engine(self) -> Any:
        """The engine of the in-process worker (`num_workers=0`, e.g. vLLM in this process), or
        None with Ray workers (partial rollouts set its `weight_poll`)."""
        return None if self._local is None else self._local.engine

    # -- the two calls of the training loop ------------------------------------------------------
    def run(self, specs: Sequence[EpisodeSpec], params: SamplingParams, seed: int | None = None,
            *, split: str = "train", one_per_run: bool = False) -> list[Trajectory]:
        """Run every spec once and return one trajectory per spec, in the order of `specs`
        (a user's agent, the `run_agents` hook: without `one_per_run` a run may give several,
        each shard's in spec order, shards concatenated in order: spec order when each group's
        specs are adjacent, as `collect` makes them).

        Specs are sharded by group (`shard_specs`), one shard per live worker, each run with the same
        `seed` and the specs of the shards before it, so that its rows sample with the seeds one
        in-process call over all `specs` gives them (module doc; exactly so when each group's
        specs are adjacent, as `collect` and the evaluation harness make them; interleaved groups
        still get distinct streams). A shard whose worker dies is re-issued, once Ray has restarted that actor, to the
        same actor; to the next live worker when Ray gave it up; at most `num_workers + 1` times.

        Raises:
            RuntimeError: a shard failed on every attempt (all workers dead).
            Exceptions raised inside a worker (a bug, not an env failure) propagate.
        """
        t0 = time.perf_counter()
        specs = list(specs)
        if self._local is not None:
            out = self._local.run(specs, params, seed, split=split, one_per_run=one_per_run)
            self.stats["run_s"] = time.perf_counter() - t0
            return out
        import ray
        from ray.exceptions import RayActorError

        live = [w for w in range(self.num_workers) if self.alive[w]]
        if not live:
            raise RuntimeError("every rollout worker is dead (Ray gave up restarting them)")
        shards = shard_specs(specs, len(live))
        weights = self._latest  # one consistent push, even while another thread pushes
        pending: dict[Any, tuple[int, int, int]] = {}  # ref -> (shard, worker, attempt)

        def submit(s: int, w: int, attempt: int) -> None:
            before = [specs[i] for shard in shards[:s] for i in shard]
            ref = self.workers[w].run.remote([specs[i] for i in shards[s]], params, seed,
                                             split=split, weights=weights, before=before,
                                             one_per_run=one_per_run)
            pending[ref] = (s, w, attempt)

        for s, idx in enumerate(shards):
            if idx:
                submit(s, live[s], 0)
        results: dict[int, list[Trajectory]] = {}
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            s, w, attempt = pending.pop(ref)
            try:
                results[s] = ray.get(ref)
            except RayActorError as e:
                target = w if self._revive(w) else self._next_alive(w)
                if target is None or attempt + 1 > self.num_workers:
                    raise RuntimeError(f"rollout shard {s} ({len(shards[s])} episodes) failed on "
                                       f"{attempt + 1} attempts; last worker error: {e}") from e
                self.stats["reissued"] += 1
                submit(s, target, attempt + 1)
        if any(len(trajs) != len(shards[s]) for s, trajs in results.items()):  # a user's agent
            self.stats["run_s"] = time.perf_counter() - t0
            return [tr for s in sorted(results) for tr in results[s]]
        ordered: list[Trajectory] = [None] * len(specs)  # type: ignore[list-item]
        for s, trajs in results.items():
            for i, tr in zip(shards[s], trajs):
                ordered[i] = tr
        self.stats["run_s"] = time.perf_counter() - t0
        return ordered

    def _revive(self, w: int) -> bool:
        """Wait until worker `w` answers again after a failure (Ray restarts it: a call made
        while it restarts fails with `ActorUnavailableError`). False, and `w` is marked dead,
        when Ray gave up on it (`ActorDiedError`) or it is not back within `restart_timeout_s`."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError

        deadline = time.monotonic() + self.restart_timeout_s
        while self.alive[w] and time.monotonic() < deadline:
            try:
                ray.get(self.workers[w].ready.remote(), timeout=max(1.0, deadline - time.monotonic()))
                return True
            except ActorUnavailableError:
                time.sleep(0.2)
            except (ActorDiedError, ray.exceptions.GetTimeoutError):
                break
        self.alive[w] = False
        return False

    def _next_alive(self, w: int) -> int | None:
        """The first live worker after `w` (cyclically), or None when all are dead."""
        for k in range(1, self.num_workers + 1):
            if self.alive[(w + k) % self.num_workers]:
                return (w + k) % self.num_workers
        return None

    def update_weights(self, state_dict: dict[str, Any], version: int) -> float:
        """Push a full state dict to every worker as policy `version`; returns the seconds.

        The tensors are detached and moved to CPU, put in Ray's object store once, and every
        worker loads them from there (in parallel). A worker that is dead or restarting is
        skipped: it loads the same object on its next `run` (see `RolloutWorker.run`).
        """
        t0 = time.perf_counter()
        self.version = int(version)
        self._push_id += 1
        if self._local is not None:
            self.stats["load_s_max"] = self._local.update_weights(state_dict, version)
            self.stats["put_s"] = 0.0
            self.stats["sync_s"] = time.perf_counter() - t0
            return self.stats["sync_s"]
        import ray
        from ray.exceptions import RayActorError

        cpu = {k: v.detach().to("cpu", copy=False).contiguous() for k, v in state_dict.items()}
        self._weights_ref = ray.put(cpu)
        self._latest = [self._push_id, self.version, self._weights_ref]
        self.stats["put_s"] = time.perf_counter() - t0
        refs = [w.update_weights.remote(self._weights_ref, self.version, self._push_id)
                for w, ok in zip(self.workers, self.alive) if ok]
        loads = []
        for ref in refs:
            try:
                loads.append(ray.get(ref))
            except RayActorError:
                continue  # a dead or restarting worker catches up on its next run
        self.stats["load_s_max"] = max(loads, default=0.0)
        self.stats["sync_s"] = time.perf_counter() - t0
        return self.stats["sync_s"]

    # -- reward wrapper state (checkpoints) -------------------------------------------------------
    def reward_states(self) -> list[dict[str, Any] | None]:
        """Each worker's reward wrapper state (`RolloutWorker.reward_state`; None for a dead
        worker or one without wrappers), in worker order (one entry with `num_workers=0`)."""
        if self._local is not None:
            return [self._local.reward_state()]
        import ray
        from ray.exceptions import RayActorError

        out: list[dict[str, Any] | None] = []
        for w, ok in zip(self.workers, self.alive):
            try:
                out.append(ray.get(w.reward_state.remote()) if ok else None)
            except RayActorError:
                out.append(None)
        return out

    def load_reward_states(self, states: Sequence[dict[str, Any] | None]) -> list[str]:
        """Push `reward_states()`'s list back, worker i getting entry i (on resume). Returns
        notes: the lists differ in length (the run resumed with another `rollout.num_workers`:
        nothing is restored, each worker starts from the initial state), or a worker's own
        notes.

        Raises:
            ValueError: a saved state does not fit its worker's wrappers.
        """
        n = 1 if self._local is not None else self.num_workers
        if len(states) != n:
            return [f"the reward wrappers start from their initial state: the checkpoint holds the state "
                    f"of {len(states)} rollout worker(s), this run has {n}"]
        if self._local is not None:
            return self._local.load_reward_state(states[0])
        import ray

        notes = ray.get([w.load_reward_state.remote(st) for w, st in zip(self.workers, states)])
        return sorted({f"worker {i}: {x}" for i, ns in enumerate(notes) for x in ns})

    # -- inspection and shutdown -----------------------------------------------------------------
    def policy_versions(self) -> list[int]:
        """The policy version each worker's engine holds (-1 for a dead worker)."""
        if self._local is not None:
            return [self._local.policy_version()]
        import ray
        from ray.exceptions import RayActorError

        out = []
        for w, ok in zip(self.workers, self.alive):
            try:
                out.append(int(ray.get(w.policy_version.remote())) if ok else -1)
            except RayActorError:
                out.append(-1)
        return out

    def shutdown(self) -> None:
        """Kill the worker actors (the Ray cluster itself stays up)."""
        if self.workers:
            import ray

            for w in self.workers:
                ray.kill(w, no_restart=True)
            self.workers = []
