"""`JudgeReward`, and the table of reward wrappers that config `env.wrappers` names.

`RewardWrappers(names, options)` builds the heavy or stateful parts once (judge client with its
cache and concurrency limit, classifier models, the curiosity memory, the Lagrange multiplier)
and shares them between every env it wraps, so that a run with many env copies has one judge
connection pool, one constraint and one notion of "novel".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from agentrl.rewards.base import Message, ScoringWrapper
from agentrl.rewards.classifier import (
    ClassifierReward,
    LagrangeMultiplier,
    SafetyReward,
    load_classifier,
)
from agentrl.rewards.curiosity import CuriosityBonus, CuriosityMemory
from agentrl.rewards.judge import Judge, JudgeClient, make_judge
from agentrl.rewards.remote import RemoteClassifier


class JudgeReward(ScoringWrapper):
    """Reward from an AI judge: `judge.judge(conversation, answer).reward` (the score mapped to
    [0, 1]) replaces or adds to the env's reward.

    Component `judge`; `info["judge"]` = the judgement summary (score, reply, error, cached, ...).
    A failed judgement (unparsable reply, out-of-range score, dead server) gives reward NaN and
    `info["error"]`, so the episode is excluded from group statistics (case R1), never 0.
    Keywords for the offline rule judge come from the reset info's `keywords` when present.

    Args:
        env: env to wrap.
        judge: a judge object (`JudgeClient`, `RuleJudge`, ...); None builds one:
            `JudgeClient(url, **judge_kwargs)` when `url` is given, else the offline `RuleJudge`.
        url: judge endpoint (OpenAI-compatible chat completions).
        mode, weight, when: see `ScoringWrapper` (defaults: replace, 1.0, end).
        **judge_kwargs: `JudgeClient` options (model, low, high, template, rubric, timeout,
            max_retries, max_concurrency, ...) or `RuleJudge` options without a URL.
    """

    def __init__(self, env: gym.Env, judge: Judge | None = None, *, url: str | None = None, mode: str = "replace",
                 weight: float = 1.0, when: str = "end", **judge_kwargs: Any):
        if judge is not None and (url or judge_kwargs):
            raise ValueError("judge: give either a judge object or url/options, not both")
        self.judge = judge if judge is not None else make_judge(url, **judge_kwargs)
        record = {"url": url, "mode": mode, "weight": weight, "when": when, **judge_kwargs}
        super().__init__(env, name="judge", scorer=self._score, mode=mode, weight=weight, when=when, record=record)

    def _score(self, conversation: list[Message], answer: str) -> tuple[float, dict[str, Any], str | None]:
        r = self.judge.judge(conversation, answer, keywords=self.reset_info.get("keywords"))
        return r.reward, {"judge": r.info()}, r.error


#: names usable in config `env.wrappers` -> wrapper class
WRAPPERS: dict[str, type[gym.Wrapper]] = {
    "judge": JudgeReward,
    "classifier": ClassifierReward,
    "safety": SafetyReward,
    "curiosity": CuriosityBonus,
}

_JUDGE_WRAPPER_KEYS = ("mode", "weight", "when")
_CLASSIFIER_WRAPPER_KEYS = ("mode", "weight", "when")
_SAFETY_WRAPPER_KEYS = ("method", "lam", "cost", "threshold", "when")
_LAGRANGE_KEYS = ("lr", "budget", "update_every")


def _split(opts: dict[str, Any], keys: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    return {k: v for k, v in opts.items() if k in keys}, {k: v for k, v in opts.items() if k not in keys}


class RewardWrappers:
    """Stack reward wrappers named in config `env.wrappers` on env instances, sharing state.

    Args:
        names: wrapper names in stacking order (innermost first), from `WRAPPERS`. Put
            `curiosity` last so that its bonus is added after every other reward.
        options: per-name keyword arguments (config `env.wrapper_kwargs`), e.g.
            `{"judge": {"url": "http://127.0.0.1:8000/v1", "mode": "replace"},
              "safety": {"method": "lagrangian", "budget": 0.05},
              "curiosity": {"method": "count", "coef": 0.1}}`.
            judge: `url`, wrapper keys mode/weight/when, the rest to `JudgeClient`/`RuleJudge`.
            classifier: `model` (path or None), mode/weight/when, the rest to `SequenceClassifier`.
            safety: `classifier` (path or None), method/lam/cost/threshold/when, lr/budget/
            update_every (the shared multiplier), the rest to `SequenceClassifier`.
            curiosity: `CuriosityMemory` settings.
        remote: score the classifier / safety model on its own Ray actor
            (`agentrl.rewards.remote.RemoteClassifier` keywords: dtype, cpus, gpus, torch_threads,
            ray_address; `placement.reward_model=worker`); None: in this process.

    Raises:
        ValueError: an unknown name, a duplicate, or options for a name not in `names`
            (the message lists the allowed names).
    """

    def __init__(self, names: Sequence[str], options: dict[str, dict[str, Any]] | None = None, *,
                 remote: dict[str, Any] | None = None):
        self.remote = remote
        options = {k: dict(v or {}) for k, v in (options or {}).items()}
        for n in names:
            if n not in WRAPPERS:
                raise ValueError(f"env.wrappers: unknown wrapper {n!r}; allowed: {', '.join(WRAPPERS)}")
        if len(set(names)) != len(names):
            raise ValueError(f"env.wrappers: each wrapper may appear once, got {list(names)}")
        extra = sorted(set(options) - set(names))
        if extra:
            raise ValueError(f"env.wrapper_kwargs: options for {extra} but env.wrappers is {list(names)}")
        self.names = list(names)
        self.options = options
        self._build: list[Any] = [getattr(self, f"_make_{n}")(options.get(n, {})) for n in self.names]

    def _make_judge(self, opts: dict[str, Any]) -> Any:
        wrap, rest = _split(opts, _JUDGE_WRAPPER_KEYS)
        url = rest.pop("url", None)
        self.judge: Judge = make_judge(url, **rest)
        return lambda env: JudgeReward(env, self.judge, **wrap)

    def _make_classifier(self, opts: dict[str, Any]) -> Any:
        wrap, rest = _split(opts, _CLASSIFIER_WRAPPER_KEYS)
        self.reward_model = self._classifier(rest.pop("model", None), rest)
        return lambda env: ClassifierReward(env, self.reward_model, **wrap)

    def _make_safety(self, opts: dict[str, Any]) -> Any:
        wrap, rest = _split(opts, _SAFETY_WRAPPER_KEYS)
        lag, rest = _split(rest, _LAGRANGE_KEYS)
        self.safety_classifier = self._classifier(rest.pop("classifier", None), rest)
        self.multiplier = LagrangeMultiplier(wrap.get("lam", 1.0), **lag)
        return lambda env: SafetyReward(env, self.safety_classifier, multiplier=self.multiplier, **wrap)

    @classmethod
    def from_config(cls, cfg: Any) -> RewardWrappers:
        """The wrappers of a run's `cfg.env.wrappers`, the classifier on its worker when
        `cfg.placement.reward_model=worker`."""
        p = cfg.placement
        remote = None
        if p.reward_model == "worker":
            remote = {"dtype": p.reward_model_dtype, "cpus": p.reward_model_cpus, "gpus": p.reward_model_gpus,
                      "torch_threads": cfg.train.torch_threads, "ray_address": cfg.rollout.ray_address}
        return cls(cfg.env.wrappers, cfg.env.wrapper_kwargs, remote=remote)

    def _classifier(self, model: Any, kwargs: dict[str, Any]) -> Any:
        if self.remote is not None and isinstance(model, (str, Path)):
            return RemoteClassifier(model, **self.remote, **kwargs)
        return load_classifier(model, **kwargs)

    def take_reward_model_seconds(self) -> float:
        """Seconds the classifier / safety models spent scoring since the last call (the
        worker's busy time with `remote`; 0 for the lexicon)."""
        seen, total = set(), 0.0
        for c in (getattr(self, "reward_model", None), getattr(self, "safety_classifier", None)):
            if c is not None and id(c) not in seen and hasattr(c, "take_busy"):
                seen.add(id(c))
                total += float(c.take_busy())
        return total

    def _make_curiosity(self, opts: dict[str, Any]) -> Any:
        self.curiosity = CuriosityMemory(**opts)
        return lambda env: CuriosityBonus(env, self.curiosity)

    def wrap(self, env: gym.Env) -> gym.Env:
        """`env` with the wrappers stacked (innermost first)."""
        for build in self._build:
            env = build(env)
        return env

    def metrics(self) -> dict[str, float]:
        """Run-level figures to log: judge request/retry/cache/parse-error counts
        (`judge/...`), the Lagrange multiplier (`safety/lambda`), curiosity steps."""
        out: dict[str, float] = {}
        judge = getattr(self, "judge", None)
        if isinstance(judge, JudgeClient):
            out.update({f"judge/{k}": float(v) for k, v in judge.stats.items()})
        if hasattr(self, "multiplier"):
            out["safety/lambda"] = self.multiplier.value
        if hasattr(self, "curiosity"):
            out["curiosity/t"] = float(self.curiosity.t)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The state that changes rewards across steps, to checkpoint (`agentrl.learner.checkpoints.
        pack_state` writes it): `curiosity` (the memory: counts, RND networks, t), `safety`
        (the Lagrange multiplier, its update count and buffered costs) and `judge` (a
        `JudgeClient`'s score cache and counters), each present when its wrapper is; numpy
        arrays and JSON scalars. The classifiers and the offline rule judge hold none."""
        out: dict[str, Any] = {"names": list(self.names)}
        if hasattr(self, "curiosity"):
            out["curiosity"] = self.curiosity.state_dict()
        if hasattr(self, "multiplier"):
            out["safety"] = self.multiplier.state_dict()
        judge = getattr(self, "judge", None)
        if isinstance(judge, JudgeClient):
            out["judge"] = judge.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> list[str]:
        """Restore `state_dict()`'s parts into the wrappers this object has. Returns a note for
        each part that could not be restored (a wrapper the saved run did not have, or one it
        had that this run has not), so that a resume that changed `env.wrappers` says so.

        Raises:
            ValueError: a saved part does not fit its wrapper (another curiosity method, table
                or network size).
        """
        notes = []
        for part, have in (("curiosity", hasattr(self, "curiosity")), ("safety", hasattr(self, "multiplier")),
                           ("judge", isinstance(getattr(self, "judge", None), JudgeClient))):
            if part in state and not have:
                notes.append(f"the saved {part} state is not used: this run has no {part} wrapper")
            elif have and part not in state:
                notes.append(f"the {part} wrapper starts from its initial state: the checkpoint has none")
        if "curiosity" in state and hasattr(self, "curiosity"):
            self.curiosity.load_state_dict(state["curiosity"])
        if "safety" in state and hasattr(self, "multiplier"):
            self.multiplier.load_state_dict(state["safety"])
        if "judge" in state and isinstance(getattr(self, "judge", None), JudgeClient):
            self.judge.load_state_dict(state["judge"])  # type: ignore[attr-defined]
        return notes

    def close(self) -> None:
        """Close the judge's HTTP pool, if any."""
        judge = getattr(self, "judge", None)
        if isinstance(judge, JudgeClient):
            judge.close()


def wrap_env(env: gym.Env, names: str | Sequence[str], options: dict[str, dict[str, Any]] | None = None) -> gym.Env:
    """`RewardWrappers(names, options).wrap(env)` for a single env (nothing shared with other
    envs). `names` may be one name or a list; `options` maps a name to its keyword arguments."""
    return RewardWrappers([names] if isinstance(names, str) else names, options).wrap(env)
