"""A run's envs made from its config: `build_env` (dataset, split, kwargs, turn limit and the
reward wrappers of `env.wrappers`), the one way every env of a run is made (driver, Ray workers,
evaluation); `user_modules` / `user_module_folders` / `unimportable`: the user's env and agent
modules, where the driver found them, and a worker's check that it imports them."""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import TYPE_CHECKING, Any

import gymnasium as gym

if TYPE_CHECKING:
    from agentrl.config import Config

from agentrl.config import ConfigError
from agentrl.env.registry import (
    REASONING_GYM_PREFIX,
    import_env_modules,
    make_env,
    module_folder,
    resolve_env_id,
)
from agentrl.rewards import RewardWrappers
from agentrl.rollout.tool_format import resolve_tool_parser

# -- from a config -------------------------------------------------------------------------------
#: the env keywords that take the tool-call format `rollout.tool_parser` resolves to (tool envs
#: `parser`, the `--agent` env `tool_parser`), unless env.kwargs names one
PARSER_KWARGS = ("parser", "tool_parser")


def _env_accepts(name: str, kwarg: str) -> bool:
    """Does the entry point of env `name` take the keyword `kwarg` (e.g. `split`)?"""
    spec = gym.spec(resolve_env_id(name))
    ep = spec.entry_point
    if isinstance(ep, str):
        mod, _, attr = ep.partition(":")
        ep = getattr(importlib.import_module(mod), attr)
    try:
        return kwarg in inspect.signature(ep).parameters
    except (TypeError, ValueError):
        return False


def build_env(cfg: Config, split: str | None = None, rewards: Any = None) -> Any:
    """Make one env from the config (dataset, split, kwargs, turn limit, and the tool-call
    format `rollout.tool_parser` for an env that takes `parser` and has none in `env.kwargs`,
    see `agentrl.rollout.tool_format`) with the reward
    wrappers of `cfg.env.wrappers` stacked on it. `rewards` (a `RewardWrappers`) lets many env
    copies share one judge client, curiosity memory and Lagrange multiplier. The modules of
    `cfg.env.imports` are imported first (in a Ray worker too).

    Raises:
        ConfigError: the env's constructor refused the keywords (a TypeError or ValueError from
            it: an unknown keyword in `env.kwargs`, a value it does not accept); the message
            names the key and the keywords.
    """
    import_env_modules(cfg.env.imports)
    kw = dict(cfg.env.kwargs)
    if cfg.env.dataset is not None:
        kw["dataset"] = cfg.env.dataset
    if split is not None and _env_accepts(cfg.env.name, "split"):
        kw["split"] = split
    for key in PARSER_KWARGS:  # a tool env's (or the agent env's) tool-call format
        if key not in kw and _env_accepts(cfg.env.name, key):
            kw[key] = resolve_tool_parser(cfg)[0]
    try:
        env = make_env(cfg.env.name, max_turns=cfg.env.max_turns, env_kwargs=kw)
    except (TypeError, ValueError) as e:  # a keyword the env does not take, a value it refuses

        key = ("env.kwargs" if cfg.env.kwargs else "env.dataset" if cfg.env.dataset is not None
               else "env.name")
        cause = e.__cause__ or e  # gymnasium re-raises the creator's error with its own text
        raise ConfigError(f"config error: {key}: {cfg.env.name} cannot be made with keywords "
                          f"{kw!r}: {type(cause).__name__}: {cause}") from e
    if cfg.env.wrappers:
        try:
            if rewards is None:
                # imported only when a wrapper is asked for

                rewards = RewardWrappers.from_config(cfg)
            env = rewards.wrap(env)
        except (TypeError, ValueError) as e:  # an unknown wrapper, a keyword it does not take

            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"config error: env.wrappers / env.wrapper_kwargs: "
                              f"{type(e).__name__}: {e}") from e
    return env


def build_named_env(cfg: Config, name: str, split: str | None = None) -> Any:
    """Make env `name` other than the run's own (e.g. one of `sft.mix_envs`): its default
    kwargs, on `split` when its constructor takes one, the modules of `cfg.env.imports`
    imported first; none of the run's env kwargs, dataset or reward wrappers."""
    import_env_modules(cfg.env.imports)
    kw = {"split": split} if split is not None and _env_accepts(name, "split") else {}
    return make_env(name, env_kwargs=kw)


# -- the user's modules in another process (Ray workers) ----------------------------------------
def user_modules(cfg: Config) -> list[tuple[str, str]]:
    """The user's modules a process imports to make the run's env, each with the key that names
    it: each of `env.imports`, the module of `env.name=module:Class`, and the agent's
    (`env.kwargs.agent=MODULE:FUNCTION`, `--agent`)."""
    found = [("env.imports", m) for m in cfg.env.imports]
    name = cfg.env.name
    if ":" in name and not name.startswith(REASONING_GYM_PREFIX):
        found.append(("env.name", name.partition(":")[0]))
    agent = dict(cfg.env.kwargs).get("agent")
    if isinstance(agent, str) and ":" in agent:
        found.append(("env.kwargs.agent", agent.partition(":")[0]))
    return found


def user_module_folders(cfg: Config) -> list[str]:
    """The folders this process finds `user_modules(cfg)` in (`module_folder`: e.g. the current
    folder of `agentrl train --agent my_agent:solve`), for a Ray worker's `sys.path`, whose
    current folder and `sys.path` may differ from the driver's."""
    return list(dict.fromkeys(f for _, m in user_modules(cfg) if (f := module_folder(m)) is not None))


def add_folders(folders: list[str] | tuple[str, ...]) -> None:
    """Append each of `folders` missing from `sys.path` (`user_module_folders` of the driver):
    appended, so nothing this process imports already changes."""
    for f in folders:
        if f not in sys.path:
            sys.path.append(f)
    importlib.invalidate_caches()


def unimportable(modules: list[tuple[str, str]], who: str) -> list[str]:
    """One line per `(key, module)` of `modules` (`user_modules`) that this process (`who`, e.g.
    `rollout worker 0 (pid 123)`) cannot import: the key, the module, the error's first line."""
    bad = []
    for key, m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - any failure of the import: one line, named
            first = (str(e).strip().splitlines() or [""])[0][:200]
            bad.append(f"{key}: {who} cannot import module {m!r} ({type(e).__name__}: {first})")
    return bad
