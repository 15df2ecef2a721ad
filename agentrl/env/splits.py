"""Held-out splits of task files that users bring (`--dataset tasks.jsonl`: the agent env,
`agentrl.gateway.agents`, and `mcp_tools`): every fifth task (index 4, 9, ...) is held out from
5 tasks on; with fewer, both splits are all the tasks, and the run says so at start-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: fewest tasks from which every fifth is held out
MIN_TASKS_TO_HOLD_OUT = 5


def heldout_is_train_note(n: int, dataset: str | None) -> str:
    """The `[run]` line's (and `agentrl eval`'s) warning for a task file of `n` tasks, fewer than
    `MIN_TASKS_TO_HOLD_OUT`, and no held-out file: its held-out figures measure the training
    tasks."""
    return (f"warning: held-out == train: the {n} task{'s' * (n != 1)} of {dataset} are both the "
            "training and the held-out tasks (every fifth task is held out from 5 tasks on); "
            "give 5 or more tasks, or env.kwargs.heldout=FILE")


def split_tasks(tasks: list[dict[str, Any]], split: str, heldout: str | None,
                load: Callable[[str], list[dict[str, Any]]], who: str) -> list[dict[str, Any]]:
    """The tasks of `split` (`train`, `heldout` or `all`; `test`, `eval` and `held_out` mean
    `heldout`) of a task file's `tasks`: `all` is every task of the file; with a `heldout` file
    (read with `load`), `train` is all of `tasks` and `heldout` that file's; else every fifth
    task (index 4, 9, ...) is held out when there are `MIN_TASKS_TO_HOLD_OUT` or more, and both
    splits are all the tasks when there are fewer.

    Raises:
        ValueError: an unknown split (naming `who`, the env).
    """
    split = {"test": "heldout", "eval": "heldout", "held_out": "heldout"}.get(split, split)
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"{who}: unknown split {split!r} (train, heldout or all)")
    if split == "all":
        return list(tasks)
    if heldout is not None:
        return load(heldout) if split == "heldout" else list(tasks)
    if len(tasks) < MIN_TASKS_TO_HOLD_OUT:
        return list(tasks)
    return [t for i, t in enumerate(tasks) if (i % 5 == 4) == (split == "heldout")]
