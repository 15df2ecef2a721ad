"""Shared plumbing of the reward wrappers: the transcript each wrapper keeps, and the
`info["reward_components"]` bookkeeping.

`info["reward_components"]` maps a component name to its contribution to the returned reward
(`env`, `judge`, `classifier`, `safety`), plus the two-way split `extrinsic` / `intrinsic` that
the curiosity wrapper writes. The framework logs each as `reward/<name>`; pass rates and eval use
`extrinsic` when present (the curiosity bonus never enters it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

Message = dict[str, Any]
#: scorer(conversation, answer) -> (value, info updates, error or None)
Scorer = Callable[[list[Message], str], tuple[float, dict[str, Any], "str | None"]]

#: when a scoring wrapper scores: at every agent turn, or only at the turn that ends the episode
WHEN = ("end", "step")
#: how a scoring wrapper combines its score with the env's reward
MODES = ("replace", "add")


def check_choice(name: str, value: str, allowed: Sequence[str]) -> str:
    """Return `value` if allowed, else raise ValueError naming `name` and the allowed values."""
    if value not in allowed:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(map(repr, allowed))}")
    return value


def with_components(info: dict[str, Any], env_reward: float, add_env: bool, **parts: float) -> dict[str, Any]:
    """A copy of `info` whose `reward_components` has `parts` added.

    When `add_env` is true and the inner env reported no components, its reward is recorded as
    component `env` first (so that the components sum to the returned reward).
    """
    out = dict(info)
    comps = dict(out.get("reward_components") or {})
    if add_env and not comps:
        comps["env"] = float(env_reward)
    comps.update({k: float(v) for k, v in parts.items()})
    out["reward_components"] = comps
    return out


def add_error(info: dict[str, Any], message: str) -> None:
    """Put `message` into `info["error"]`, appending to an error already there."""
    info["error"] = f"{info['error']}; {message}" if info.get("error") else message


class ScoringWrapper(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Base of wrappers that score the agent's answer with a model or judge.

    Keeps the transcript (reset messages, then each action as an assistant message and the env's
    new messages) and the reset info (for `keywords`). `scorer(messages, answer) -> (value,
    info_updates, error)` scores an answer to the conversation before it; `step` combines:

    - `mode="replace"`: reward = weight * value at scored turns, 0 at unscored ones;
      `mode="add"`: reward = env reward + weight * value at scored turns.
    - `when="end"`: score only the turn that ends the episode; `"step"`: every turn.
    - value NaN (a failed score): reward NaN, reason in `info["error"]` (never a silent 0).

    Args:
        env: the env to wrap.
        name: component name (`info["reward_components"][name]`).
        scorer: see above; `value` NaN or `error` set marks a failed score.
        mode: "replace" or "add".
        weight: factor on the score.
        when: "end" or "step".
        record: plain constructor arguments to record in the env spec (Gymnasium
            `RecordConstructorArgs`), so that `gym.make(env.spec)` can rebuild the stack.

    Raises:
        ValueError: unknown mode/when.
    """

    def __init__(self, env: gym.Env, *, name: str, scorer: Scorer, mode: str = "replace",
                 weight: float = 1.0, when: str = "end", record: dict[str, Any] | None = None):
        gym.utils.RecordConstructorArgs.__init__(self, **(record or {}))
        gym.Wrapper.__init__(self, env)
        self.name = name
        self._scorer = scorer
        self.mode = check_choice(f"{self.name}.mode", mode, MODES)
        self.when = check_choice(f"{self.name}.when", when, WHEN)
        self.weight = float(weight)
        self.history: list[Message] = []
        self.reset_info: dict[str, Any] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self.history = [dict(m) for m in obs]
        self.reset_info = dict(info)
        return obs, info

    def step(self, action: str):
        obs, env_reward, terminated, truncated, info = self.env.step(action)
        reward = float(env_reward)
        conversation = self.history
        self.history = conversation + [{"role": "assistant", "content": str(action)}] + [dict(m) for m in obs]
        if self.when == "end" and not (terminated or truncated):
            out = dict(info)
            if self.mode == "replace":
                return obs, 0.0, terminated, truncated, with_components(out, reward, False)
            return obs, reward, terminated, truncated, with_components(out, reward, True)
        value, extra, error = self._scorer(conversation, str(action))
        part = self.weight * value
        total = part if self.mode == "replace" else reward + part
        out = with_components(info, reward, self.mode == "add", **{self.name: part})
        out.update(extra)
        if self.mode == "replace":
            out["env_reward"] = reward
        if error is not None or math.isnan(value):
            add_error(out, error or f"{self.name}: no score")
            total = math.nan
        return obs, total, terminated, truncated, out
