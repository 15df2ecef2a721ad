"""Learning-rate schedules as plain functions of the optimizer step (used by `Learner` through
`torch.optim.lr_scheduler.LambdaLR`, so the schedule's position is saved with checkpoints)."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def lr_multiplier(step: int, *, warmup: int = 0, total: int = 0, schedule: str = "constant",
                  min_ratio: float = 0.0) -> float:
    """The factor on the base learning rate at optimizer step `step` (0-based: the factor the
    `step`-th optimizer step uses).

    Linear warm-up from `1 / (warmup + 1)` to 1 over the first `warmup` steps (step 0 uses
    1/(warmup+1), so no step runs at lr 0), then:
    - `constant`: 1;
    - `linear`: from 1 at step `warmup` down to `min_ratio` at step `total`;
    - `cosine`: `min_ratio + (1 - min_ratio) * (1 + cos(pi * p)) / 2` with
      `p = (step - warmup) / (total - warmup)` (Loshchilov & Hutter 2017, SGDR, without restarts).
    Past `total` the factor stays at `min_ratio` (linear, cosine).

    Args:
        step: optimizer steps already taken (>= 0).
        warmup: warm-up steps (>= 0).
        total: the step where decay ends (the run's optimizer steps); ignored by `constant`.
        schedule: one of `SCHEDULES`.
        min_ratio: the final factor of the decaying schedules, in [0, 1].

    Raises:
        ValueError: an unknown schedule, a negative step/warm-up, or `min_ratio` outside [0, 1].
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"lr schedule: unknown {schedule!r}; allowed: {', '.join(SCHEDULES)}")
    if step < 0 or warmup < 0:
        raise ValueError(f"lr schedule: step and warmup must be >= 0, got {step}, {warmup}")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"lr schedule: min_ratio must be in [0, 1], got {min_ratio}")
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant" or total <= warmup:
        return 1.0
    p = min(1.0, (step - warmup) / (total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * p
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
