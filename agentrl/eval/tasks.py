"""Which tasks an evaluation runs: the env's own task list when it has one, else seeds.

Protocol: an env (or its unwrapped core) that evaluates a fixed set of tasks (a dataset)
defines `eval_tasks() -> list[dict]`, the reset kwargs of each task of its current split in a
fixed order (e.g. `{"options": {"task_index": i}}`). Every other env is evaluated on the
held-out seeds `EVAL_SEED + i` (`agentrl.train.EVAL_SEED`), the same tasks the in-training
evaluation uses.
"""

from __future__ import annotations

from typing import Any


def seed_tasks(n: int) -> list[dict[str, Any]]:
    """Reset kwargs `{"seed": EVAL_SEED + i}` for i < n (`agentrl.train.EVAL_SEED`)."""
    from agentrl.train import EVAL_SEED

    return [{"seed": EVAL_SEED + i} for i in range(n)]


def list_tasks(env: Any, max_tasks: int | None = None, *, default_n: int = 64
               ) -> tuple[list[dict[str, Any]], str]:
    """The reset kwargs of the tasks to evaluate on `env`, and a label of their source.

    Args:
        env: a made env (wrappers allowed).
        max_tasks: keep the first `max_tasks` tasks of the env's list; for an env without a
            list, the number of seeded tasks (None: all listed tasks, or `default_n` seeds).
        default_n: seeded tasks when `max_tasks` is None.

    Returns:
        `(tasks, source)`: `source` is `"env.eval_tasks()"` or `"seeds EVAL_SEED+i"`.

    Raises:
        ValueError: `max_tasks` < 1, or the env's list is empty.
    """
    if max_tasks is not None and max_tasks < 1:
        raise ValueError(f"max_tasks must be >= 1, got {max_tasks}")
    for obj in (env, getattr(env, "unwrapped", env)):
        hook = getattr(obj, "eval_tasks", None)
        if callable(hook):
            tasks = [dict(t) for t in hook()]
            if not tasks:
                raise ValueError(f"env {type(obj).__name__}: eval_tasks() lists no tasks for this split")
            return (tasks[:max_tasks] if max_tasks else tasks), "env.eval_tasks()"
    return seed_tasks(max_tasks or default_n), "seeds EVAL_SEED+i"
