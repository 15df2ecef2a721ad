"""The reward wrappers' state in a run's checkpoints (e.g. curiosity's memory, the judge's
cache): read from the driver's wrappers and the rollout workers' when saving
(`reward_state`), put back on `--resume` (`restore_reward_state`). The file is
`agentrl.learner.checkpoints.REWARD_STATE` (`pack_state`: tensors and JSON, no pickle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentrl.learner.checkpoints import REWARD_STATE, unpack_state


def reward_state(lp: Any) -> dict[str, Any] | None:
    """The state of the run's reward wrappers (`lp`: the run's `agentrl.rollout.stages.Loop`), to
    checkpoint (None when `env.wrappers` is empty): `driver` (this process's
    `RewardWrappers.state_dict`) and `workers` (each rollout worker's, when a `RolloutPool`
    holds the envs; else None)."""
    if not lp.cfg.env.wrappers:
        return None
    workers = lp.engine.reward_states() if hasattr(lp.engine, "reward_states") else None
    return {"format": 1, "driver": lp.rewards.state_dict() if lp.rewards is not None else None,
            "workers": workers}


def restore_reward_state(lp: Any, ck: Path) -> None:
    """Load checkpoint `ck`'s reward wrapper state (`reward_state`) into the driver's wrappers
    and push the workers' back to them; says a `[resume]` note for each part not restored (a
    checkpoint without the file, a changed `env.wrappers` or `rollout.num_workers`).

    Raises:
        ValueError: the file is unreadable, or a part does not fit its wrapper (names `ck`).
    """
    f = ck / REWARD_STATE
    if not f.exists():
        if lp.cfg.env.wrappers:
            lp.say(f"[resume] {ck} has no {REWARD_STATE}: the reward wrappers start from their initial state")
        return
    if not lp.cfg.env.wrappers:
        lp.say(f"[resume] {f} is not used: this run has no env.wrappers")
        return
    state = unpack_state(f)
    notes: list[str] = []
    try:
        if lp.rewards is not None:
            notes += lp.rewards.load_state_dict(state["driver"] or {})
        if hasattr(lp.engine, "load_reward_states"):
            notes += lp.engine.load_reward_states(state["workers"] or [])
    except ValueError as e:
        raise ValueError(f"{f}: {e}") from None
    for note in notes:
        lp.say(f"[resume] {note}")
