"""One call that runs the episodes of a batch of task seeds, in this process or on Ray workers."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agentrl.config import Config
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.trajectory import Trajectory


def collect(engine: Any, renderer: ChatRenderer, envs: list[Any], seeds: list[int], group_size: int,
            params: SamplingParams, cfg: Config, pool: ThreadPoolExecutor, *, group_base: int,
            sample_seed: int, split: str = "train") -> list[Trajectory]:
    """Run `group_size` episodes of each task seed (a group = the same task reset with the same
    seed). Returns `len(seeds) * group_size` trajectories, group-major. `engine` is an
    in-process engine, or a `RolloutPool` of Ray workers that hold their own envs."""
    specs = [EpisodeSpec({"seed": s}, group_id=group_base + j)
             for j, s in enumerate(seeds) for _ in range(group_size)]
    if hasattr(engine, "run"):  # a RolloutPool: Ray workers (or vLLM) hold the envs
        return engine.run(specs, params, seed=sample_seed, split=split)
    return run_episodes(engine, renderer, envs, specs, params, executor=pool,
                        max_episode_tokens=cfg.rollout.max_episode_tokens, seed=sample_seed)
