"""A run's envs made from its config: `build_env` (dataset, split, kwargs, turn limit and the
reward wrappers of `env.wrappers`), the one way every env of a run is made (driver, Ray workers,
evaluation)."""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any

import gymnasium as gym

if TYPE_CHECKING:
    from agentrl.config import Config

from agentrl.config import ConfigError
from agentrl.env.registry import import_env_modules, make_env, resolve_env_id
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
