"""Which tasks an evaluation runs: the env's own task list when it has one, else seeds.

Protocol, checked in this order on the env and its unwrapped core:
1. `eval_tasks() -> list[dict]`: the reset kwargs of each task to evaluate, in a fixed order;
2. `tasks() -> list`: the fixed task list of the env's split (the code_sandbox env: a dataset
   file's tasks, or the built-in family's fixed list); task i is reset with
   `options={"task_index": i}`;
3. otherwise the held-out seeds `EVAL_SEED + i` (`agentrl.eval.episodes.EVAL_SEED`), the same tasks the
   in-training evaluation uses.
"""

from __future__ import annotations

from typing import Any

from agentrl.eval.episodes import EVAL_SEED


def seed_tasks(n: int) -> list[dict[str, Any]]:
    """Reset kwargs `{"seed": EVAL_SEED + i}` for i < n (`agentrl.eval.episodes.EVAL_SEED`)."""
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
        `(tasks, source)`: `source` is `"env.eval_tasks()"`, `"env.tasks()"` or
        `"seeds EVAL_SEED+i"`.

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
    for obj in (env, getattr(env, "unwrapped", env)):
        listed = getattr(obj, "tasks", None)
        if callable(listed):
            n = len(listed())
            if n == 0:
                raise ValueError(f"env {type(obj).__name__}: tasks() lists no tasks for this split")
            n = min(n, max_tasks) if max_tasks else n
            return [{"options": {"task_index": i}} for i in range(n)], "env.tasks()"
    return seed_tasks(max_tasks or default_n), "seeds EVAL_SEED+i"


def eval_task_count(env: Any, n: int) -> int:
    """How many tasks an evaluation of at most `n` tasks runs on `env` (`list_tasks(env, n)`):
    `n` for seeded tasks, else the smaller of `n` and the env's list (a dataset with fewer
    held-out tasks than `train.eval_tasks` evaluates them all, and says so)."""
    return len(list_tasks(env, n, default_n=n)[0])
