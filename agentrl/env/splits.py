"""Held-out splits of task files that users bring (`--dataset tasks.jsonl`: the agent env,
`agentrl.gateway.agents`, and `mcp_tools`): every fifth task (index 4, 9, ...) is held out from
5 tasks on; with fewer, both splits are all the tasks, and the run says so at start-up."""

from __future__ import annotations

#: fewest tasks from which every fifth is held out
MIN_TASKS_TO_HOLD_OUT = 5


def heldout_is_train_note(n: int, dataset: str | None) -> str:
    """The `[run]` line's (and `agentrl eval`'s) warning for a task file of `n` tasks, fewer than
    `MIN_TASKS_TO_HOLD_OUT`, and no held-out file: its held-out figures measure the training
    tasks."""
    return (f"warning: held-out == train: the {n} task{'s' * (n != 1)} of {dataset} are both the "
            "training and the held-out tasks (every fifth task is held out from 5 tasks on); "
            "give 5 or more tasks, or env.kwargs.heldout=FILE")
