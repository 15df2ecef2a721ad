"""RLAIF: the agent answers a question and an AI judge scores the answer (one turn).

Tasks: `data/rlaif_prompts.jsonl` (short factual and how-to questions, each with `keywords` that
a good answer mentions; `split` train/test). The judge is `JudgeClient(judge_url)` when a URL is
given (any OpenAI-compatible endpoint, e.g. `agentrl serve-judge` or vLLM), else the offline
`RuleJudge` baseline (keyword coverage, length, non-repetition; docs/rewards.md), so the env
runs on a fresh machine with no server.

Reward: the judge's score mapped to [0, 1]. A failed judgement (unparsable reply, out-of-range
score, unreachable judge) gives reward NaN with the reason in `info["error"]`: the episode is
excluded from group statistics (case R1), and the step never raises.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agentrl.env.base import TextEnv
from agentrl.rewards.judge import Judge, make_judge

DATA = Path(__file__).parent / "data" / "rlaif_prompts.jsonl"
HELDOUT_ALIASES = ("heldout", "test", "held_out", "held-out", "eval")
SYSTEM_PROMPT = "You are a helpful assistant. Answer the question correctly and concisely."


def load_tasks(path: str | Path = DATA, split: str = "train") -> list[dict[str, Any]]:
    """Tasks of a JSONL file (`id`, `prompt`, optional `keywords`, `split` "train" | "test").

    Args:
        split: "train", "heldout" (aliases "test", "held_out", "held-out", "eval": the rows
            marked "test") or "all".

    Raises:
        ValueError: unknown split, or no task in it.
    """
    want = "test" if split in HELDOUT_ALIASES else split
    if want not in ("train", "test", "all"):
        raise ValueError(f"split: {split!r} is not one of 'train', 'heldout' (or 'test'), 'all'")
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    tasks = [r for r in rows if want == "all" or r.get("split", "train") == want]
    if not tasks:
        raise ValueError(f"no tasks in split {split!r} of {path}")
    return tasks


def pick_task(tasks: list[dict[str, Any]], choice: Any, rng: Any) -> dict[str, Any]:
    """The task for `reset(options={"task": choice})`: an index (mod len), a task id, a task
    dict (used as is; needs `prompt`), or None (drawn with `rng`).

    Raises:
        ValueError: an unknown id or a dict without `prompt`.
    """
    if choice is None:
        return tasks[int(rng.integers(len(tasks)))]
    if isinstance(choice, dict):
        if not isinstance(choice.get("prompt"), str):
            raise ValueError("a task dict needs a str 'prompt'")
        return choice
    if isinstance(choice, (int,)) and not isinstance(choice, bool):
        return tasks[choice % len(tasks)]
    for t in tasks:
        if t.get("id") == choice:
            return t
    raise ValueError(f"unknown task {choice!r}; ids: {', '.join(str(t.get('id')) for t in tasks[:10])}, ...")


class RLAIFJudgeEnv(TextEnv):
    """Answer a question; an AI judge (or the offline rule judge) scores the answer.

    Args:
        judge_url: OpenAI-compatible endpoint of the judge; None uses the offline `RuleJudge`.
            Env copies in one process with the same URL and options share one client (its
            concurrency limit and cache).
        judge: a judge object (overrides `judge_url`).
        judge_kwargs: options of `JudgeClient` (model, low, high, template, rubric, timeout,
            max_retries, max_concurrency, ...) or of `RuleJudge`.
        split: task split, "train", "heldout" (or "test") or "all".
        tasks_path: JSONL file of tasks (default: the bundled set).
        system_prompt: system message of each episode (None: none).
    """

    def __init__(self, judge_url: str | None = None, *, judge: Judge | None = None,
                 judge_kwargs: dict[str, Any] | None = None, split: str = "train",
                 tasks_path: str | Path | None = None, system_prompt: str | None = SYSTEM_PROMPT):
        self.tasks = load_tasks(tasks_path or DATA, split)
        self.judge = judge if judge is not None else make_judge(judge_url, shared=True, **(judge_kwargs or {}))
        self.system_prompt = system_prompt
        self._task: dict[str, Any] | None = None
        self._messages: list[dict[str, Any]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._task = pick_task(self.tasks, (options or {}).get("task"), self.np_random)
        sys_msg = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        self._messages = sys_msg + [{"role": "user", "content": self._task["prompt"]}]
        info = {"task_id": str(self._task.get("id", "")), "keywords": list(self._task.get("keywords") or [])}
        return [dict(m) for m in self._messages], info

    def step(self, action: str):
        task = self._task or {}
        r = self.judge.judge(self._messages, str(action), keywords=task.get("keywords"))
        info: dict[str, Any] = {"task_id": str(task.get("id", "")), "judge": r.info(),
                                "reward_components": {"judge": r.reward}}
        if r.error is not None:
            info["error"] = r.error
        else:
            info["success"] = bool(r.reward >= 0.5)
        reward = float(r.reward) if r.error is None else math.nan
        return [], reward, True, False, info
