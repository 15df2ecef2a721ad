"""One call that runs the episodes of a batch of task seeds, in this process or on Ray workers."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from agentrl.config import Config
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.trajectory import Trajectory


def collect(engine: Any, renderer: ChatRenderer, envs: list[Any], seeds: list[int], group_size: int,
            params: SamplingParams, cfg: Config, pool: ThreadPoolExecutor, *, group_base: int,
            sample_seed: int, split: str = "train",
            make_env: Callable[[], Any] | None = None) -> list[Trajectory]:
    """Run `group_size` episodes of each task seed (a group = the same task reset with the same
    seed). Returns `len(seeds) * group_size` trajectories, group-major. `engine` is an
    in-process engine, or a `RolloutPool` of Ray workers that hold their own envs.

    In this process the envs step under `env.step_timeout_s` / `env.reset_timeout_s`; an env
    whose call timed out is replaced in `envs` by `make_env()` (default: `build_env(cfg, split)`,
    without shared reward wrappers: pass the run's own builder when it has wrappers)."""
    specs = [EpisodeSpec({"seed": s}, group_id=group_base + j)
             for j, s in enumerate(seeds) for _ in range(group_size)]
    if hasattr(engine, "run"):  # a RolloutPool: Ray workers (or vLLM) hold the envs
        return engine.run(specs, params, seed=sample_seed, split=split)
    if make_env is None:
        from agentrl.envs import build_env

        make_env = partial(build_env, cfg, split)
    return run_episodes(engine, renderer, envs, specs, params, executor=pool,
                        max_episode_tokens=cfg.rollout.max_episode_tokens, seed=sample_seed,
                        step_timeout_s=cfg.env.step_timeout_s,
                        reset_timeout_s=cfg.env.reset_timeout_s, make_env=make_env)
