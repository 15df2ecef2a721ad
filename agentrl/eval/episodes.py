"""What an episode achieved, read off its trajectory: success, extrinsic return, reward
components; and the seeds of the held-out seeded tasks. Shared by training and evaluation."""

from __future__ import annotations

from agentrl.types import Trajectory

EVAL_SEED = 10_000_000  # held-out evaluation tasks use seeds EVAL_SEED + i in every run


def episode_success(tr: Trajectory) -> bool:
    """Did the episode solve its task? The env's `info["success"]` or `verdict == "pass"` on
    its last turn when given, else a return of at least 1 (binary rewards)."""
    if tr.turns:
        info = tr.turns[-1].info
        if "success" in info:
            return bool(info["success"])
        if "verdict" in info:
            return info["verdict"] == "pass"
    r = tr.episode_return
    return r == r and r >= 1.0


def extrinsic_return(tr: Trajectory) -> float:
    """Episode return without intrinsic bonuses (`reward_components["extrinsic"]` when given)."""
    total = 0.0
    for t in tr.turns:
        comp = t.info.get("reward_components") or {}
        total += float(comp.get("extrinsic", t.reward))
    return total


def reward_component_means(trajs: list[Trajectory]) -> dict[str, float]:
    """Mean per episode of each reward component the wrappers report (`reward/judge`,
    `reward/safety`, `reward/intrinsic`, `reward/extrinsic`, ...)."""
    sums: dict[str, float] = {}
    for tr in trajs:
        for t in tr.turns:
            for k, v in (t.info.get("reward_components") or {}).items():
                if isinstance(v, (int, float)) and v == v:
                    sums[k] = sums.get(k, 0.0) + float(v)
    return {f"reward/{k}": v / max(len(trajs), 1) for k, v in sums.items()}
