"""One call that runs the episodes of a batch of task seeds, in this process or on Ray workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from agentrl.config import Config
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.envs import build_env
from agentrl.types import Trajectory


def collect(engine: Any, renderer: ChatRenderer, envs: list[Any], seeds: list[int], group_size: int,
            params: SamplingParams, cfg: Config, pool: ThreadPoolExecutor, *, group_base: int,
            sample_seed: int, split: str = "train",
            make_env: Callable[[], Any] | None = None) -> list[Trajectory]:
    """Run `group_size` episodes of each task seed (a group = the same task reset with the same
    seed). Returns `len(seeds) * group_size` trajectories, group-major. `engine` is an
    in-process engine, or a `RolloutPool` of Ray workers that hold their own envs.

    In this process the envs step under `env.step_timeout_s` / `env.reset_timeout_s`; an env
    whose call timed out is replaced in `envs` by `make_env()` (default: `build_env(cfg, split)`,
    without shared reward wrappers: pass the run's own builder when it has wrappers).

    Batch hooks an env class may define (`self_propose` does; docs/self_propose.md):
    `batch_phases(seeds) -> [[i, ...], ...]` runs the groups in phases, in that order (each
    group reset with `options={"slot": k}`, k its place in its phase), and
    `finish_batch(trajectories)` is called with all the batch's trajectories once they are
    done (to set rewards that depend on other episodes of the batch); `run_agents(engine,
    renderer, specs, params, ...)` runs the batch's episodes itself (the user's agent against
    the gateway, `agentrl.gateway.agents`). They run here only, except `run_agents`, which Ray
    rollout workers with the hf engine and the in-process vLLM pool run too (each worker runs the gateway for its share of
    the batch's runs beside its own engine: `RolloutWorker.run`); otherwise a `RolloutPool` with
    an env that defines them is refused (ValueError, `check_batch_hooks`)."""
    env0 = getattr(envs[0], "unwrapped", envs[0]) if envs else None
    phases, finish = getattr(env0, "batch_phases", None), getattr(env0, "finish_batch", None)
    agents = getattr(env0, "run_agents", None)
    branch = cfg.rollout.branch
    if agents is not None and branch > 1:
        raise ValueError(f"rollout.branch={branch} (shared first turns) needs the agent loop; an "
                         "env that runs the user's agent (--agent) runs its own turns: set rollout.branch=1")
    if agents is not None and not hasattr(engine, "run"):  # the user's agent: through the gateway
        specs = group_specs(seeds, group_size, group_base)
        return agents(engine, renderer, specs, params, max_episode_tokens=cfg.rollout.max_episode_tokens,
                      seed=sample_seed, timeout_s=cfg.env.step_timeout_s)
    if hasattr(engine, "run"):  # a RolloutPool: Ray workers (or vLLM) hold the envs
        check_batch_hooks(engine, env0)
        specs = group_specs(seeds, group_size, group_base, branch)
        return engine.run(specs, params, seed=sample_seed, split=split)
    if make_env is None:
        make_env = partial(build_env, cfg, split)
    run = partial(run_episodes, engine, renderer, params=params, executor=pool,
                  max_episode_tokens=cfg.rollout.max_episode_tokens,
                  step_timeout_s=cfg.env.step_timeout_s,
                  reset_timeout_s=cfg.env.reset_timeout_s, make_env=make_env)
    if phases is None:
        trajs = run(envs, group_specs(seeds, group_size, group_base, branch), seed=sample_seed)
    else:
        trajs = _run_phases(run, envs, seeds, phases(list(seeds)), group_size, group_base, sample_seed,
                            branch)
    if finish is not None:
        finish(trajs)
    return trajs


def collect_independent(engine: Any, renderer: ChatRenderer, envs: list[Any], seeds: list[int],
                        samples: int, cfg: Config, pool: ThreadPoolExecutor, *, temperature: float,
                        sample_seed: int, split: str = "train") -> list[Trajectory]:
    """`samples` independent episodes of each task seed (`rollout.branch` set to 1 whatever the
    config: tree rollouts would copy first turns), sampled at `temperature` with the run's
    `rollout.top_p` and `rollout.max_tokens`, in `collect` calls of `len(envs) // samples` tasks;
    the call starting at task index s samples with `sample_seed + s`. For a plain copy of a model
    sampling training tasks (the warm start's checks, its policy-repair episodes).

    Returns:
        `len(seeds) * samples` trajectories, group-major.

    Raises:
        ValueError: as `collect` (e.g. an env's batch hooks on a worker pool).
    """
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"branch": 1})})
    params = SamplingParams(temperature=temperature, top_p=cfg.rollout.top_p,
                            max_tokens=cfg.rollout.max_tokens, stop_token_ids=renderer.stop_ids)
    per_call = max(1, len(envs) // samples)
    trajs: list[Trajectory] = []
    for s in range(0, len(seeds), per_call):
        trajs += collect(engine, renderer, envs, seeds[s:s + per_call], samples, params, cfg, pool,
                         group_base=0, sample_seed=sample_seed + s, split=split)
    return trajs


def group_specs(seeds: list[int], group_size: int, group_base: int, branch: int = 1,
                options: Callable[[int], dict[str, Any]] | None = None) -> list[EpisodeSpec]:
    """`group_size` episodes of each task seed, group-major: group `group_base + j` for
    `seeds[j]`. With `branch` > 1 (`rollout.branch`), episode k of a group has trunk
    `k // branch`: every `branch` consecutive episodes share their first turn (tree rollouts).
    `options(j)`: reset options of group j's episodes (none when None).

    Raises:
        ValueError: `branch` does not divide `group_size`.
    """
    if group_size % branch:
        raise ValueError(f"rollout.branch={branch} must divide the group size {group_size}")
    return [EpisodeSpec({"seed": s, **({"options": options(j)} if options else {})},
                        group_id=group_base + j, trunk=k // branch if branch > 1 else None)
            for j, s in enumerate(seeds) for k in range(group_size)]


def sampling_specs(specs: Sequence[EpisodeSpec]) -> list[EpisodeSpec]:
    """The specs of `specs` that sample their first turn: all but those whose (group, trunk)
    an earlier spec holds (those take its first turn, `EpisodeSpec.trunk`)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for s in specs:
        if s.trunk is None or (s.group_id, s.trunk) not in seen:
            out.append(s)
        if s.trunk is not None:
            seen.add((s.group_id, s.trunk))
    return out


def check_batch_hooks(engine: Any, env: Any) -> None:
    """Refuse an env with batch hooks (`batch_phases`, `finish_batch`) when `engine` runs the
    episodes elsewhere (a `RolloutPool` of Ray workers or vLLM): the hooks need the envs and
    the engine here. An env whose only hook is `run_agents` (the user's agent) passes on every
    pool (`agents_on_workers`): each worker runs it for its shard, the gateway beside the
    worker's engine.

    Raises:
        ValueError: naming the env and the setting to change (`rollout.num_workers=0` and
            `rollout.engine=hf`).
    """
    env = getattr(env, "unwrapped", env)
    hooks = [h for h in ("batch_phases", "finish_batch", "run_agents") if hasattr(env, h)]
    if not hasattr(engine, "run") or not hooks:
        return
    if hooks == ["run_agents"] and agents_on_workers(engine):
        return  # each worker runs the gateway beside its own engine
    raise ValueError(f"env {type(env).__name__} needs its batch hooks (batch_phases / "
                     "finish_batch / run_agents) in the driver process with the in-process "
                     "engine: use rollout.num_workers=0 and rollout.engine=hf")


def agents_on_workers(engine: Any) -> bool:
    """Whether `engine` is a `RolloutPool` whose workers run an env's `run_agents` hook (the
    gateway) themselves: Ray rollout workers (`num_workers >= 1`, hf or vLLM engine in each),
    or the in-process vLLM engine (`num_workers=0`: the pool's one `RolloutWorker` in this
    process)."""
    cfg = getattr(engine, "cfg", None)
    n = int(getattr(engine, "num_workers", 0) or 0)
    return cfg is not None and (n >= 1 or cfg.rollout.engine == "vllm")


def _run_phases(run: Callable[..., list[Trajectory]], envs: list[Any], seeds: list[int],
                order: list[list[int]], group_size: int, group_base: int,
                sample_seed: int, branch: int = 1) -> list[Trajectory]:
    """Run the groups of `seeds` phase by phase (`order`: lists of indices into `seeds`, from
    the env's `batch_phases`); the group at place k of its phase is reset with
    `options={"slot": k}`. Returns the trajectories group-major in the order of `seeds`, as
    `collect` without phases does.

    Raises:
        ValueError: `order` does not list every index of `seeds` exactly once.
    """
    if sorted(i for p in order for i in p) != list(range(len(seeds))):
        raise ValueError(f"batch_phases returned {order}, not a partition of {len(seeds)} seeds")
    out: list[Trajectory | None] = [None] * (len(seeds) * group_size)
    for n, phase in enumerate(order):
        specs = group_specs([seeds[j] for j in phase], group_size, 0, branch,
                            options=lambda m: {"slot": m})
        for sp in specs:  # group ids of the batch (`group_base` + index into `seeds`)
            sp.group_id = group_base + phase[sp.group_id]
        sub = envs[:len(specs)]  # run_episodes replaces a timed-out env in this list
        trajs = run(sub, specs, seed=None if sample_seed is None else sample_seed + 7919 * n)
        envs[:len(sub)] = sub
        for k, j in enumerate(phase):
            out[j * group_size:(j + 1) * group_size] = trajs[k * group_size:(k + 1) * group_size]
    return [t for t in out if t is not None]
