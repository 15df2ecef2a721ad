"""Pieces shared by `learning_vs_trl.py` and its two workers: the training tasks (the seeds the
agentrl run draws, step by step), TRL's prompt rows, the reward (the code_sandbox env's own
extraction, sandbox job and verdict), the wall-clock checkpoint schedule, and the run config.

The reward here is what `agentrl_envs.code_sandbox.CodeSandboxEnv.step` computes for a
single-turn episode, piece by piece: `extract_code` on the decoded action, nothing to run -> 0,
else the task's tests through `sandbox_job` in the process-wide sandbox pool of the env's
backend with the env's limits, 1.0 iff the verdict is `pass` (binary, the default) or the pass
fraction (`reward=fraction`). `env_reward` runs the env itself, to check they agree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def worker_args(argv: list[str] | None = None) -> Any:
    """The command line both training workers take: `--warm DIR --out DIR --budget-s S
    --every-s S --max-steps N` (seconds of training wall clock; N caps the steps, and on the
    TRL side the dataset rows prepared, x tasks_per_step)."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--warm", required=True, help="the warm-start run dir (config.json, sft_model/)")
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=420)
    p.add_argument("--every-s", type=float, default=60)
    p.add_argument("--max-steps", type=int, default=1000, help="most steps (TRL: rows prepared, x tasks_per_step)")
    return p.parse_args(argv)


def run_config(warm: str | Path, overrides: list[str] | None = None) -> Any:
    """The warm-start run's config (`WARM/config.json`: the main job's defaults) with
    `overrides` on top."""
    from agentrl.config import load_config

    return load_config(str(Path(warm) / "config.json"), list(overrides or []))


def step_seeds(seed: int, step: int, tasks_per_step: int) -> list[int]:
    """The task seeds of training step `step`, as the training loop's `agentrl.rollout.stages.run_batch` draws them."""
    rng = np.random.default_rng([seed, step])
    return [int(s) for s in rng.integers(0, 2**31 - 1, size=tasks_per_step)]


def task_rows(cfg: Any, steps: int) -> tuple[list[dict[str, Any]], dict[int, Any]]:
    """TRL's training rows for `steps` steps (`tasks_per_step` rows per step, in the order the
    agentrl run meets the tasks) and the task of each row.

    Each row: `prompt` (the env's opening messages, system + user, as a conversational prompt),
    `row` (index), `step`, `seed`. Returns `(rows, {row: CodeTask})`."""
    from agentrl.run import build_env

    env = build_env(cfg, "train")
    rows, tasks = [], {}
    for step in range(steps):
        for seed in step_seeds(cfg.seed, step, cfg.rollout.tasks_per_step):
            obs, _ = env.reset(seed=seed)
            i = len(rows)
            rows.append({"prompt": [{"role": m["role"], "content": m["content"]} for m in obs],
                         "row": i, "step": step, "seed": seed})
            tasks[i] = env.unwrapped.task
    return rows, tasks


class CodeReward:
    """The code_sandbox env's reward of one answer to one task, without an env per call.

    Args:
        cfg: the run config (the env's kwargs: reward mode, limits, sandbox backend)."""

    def __init__(self, cfg: Any):
        from agentrl.run import build_env

        env = build_env(cfg, "train").unwrapped
        self.limits, self.backend, self.mode = env.limits, env.backend, env.reward_mode
        self.max_turns = env.max_turns
        if self.max_turns != 1:
            raise ValueError(f"the comparison is single-turn; the env has max_turns={self.max_turns}")

    def __call__(self, task: Any, text: str) -> float:
        from agentrl.sandbox.pool import default_pool
        from agentrl_envs.code_sandbox import extract_code, sandbox_job

        code = extract_code(text)
        if not code.strip():
            return 0.0
        try:
            # every answer is run (cache=False): a TRL reward function as a user writes it,
            # without agentrl's verdict cache, as the comparison has measured it since it began
            res = default_pool(self.backend).run_tests(**sandbox_job(task, code, self.limits), cache=False)
        except Exception:  # noqa: BLE001 - the env records a failing sandbox as 0 (sandbox_error)
            return 0.0
        if res.verdict == "pass":
            return 1.0
        return float(res.pass_fraction) if self.mode == "fraction" else 0.0


def warm_sandbox(cfg: Any) -> float:
    """Start the process-wide sandbox pool before the clock starts (both sides): the reference
    solution of one training task through `CodeReward`; returns its reward (1.0)."""
    from agentrl.run import build_env

    env = build_env(cfg, "train")
    env.reset(seed=0)
    task = env.unwrapped.task
    return CodeReward(cfg)(task, task.solution)


def env_reward(env: Any, seed: int, text: str) -> float:
    """The reward the env itself gives `text` as the one answer to the task of `seed`."""
    env.reset(seed=seed)
    return float(env.step(text)[1])


class Clock:
    """Training wall clock with the checkpoint saves taken out, and the save schedule: a save
    is due at the first step end at or after `every_s`, `2 * every_s`, ... and at the step end
    that reaches `budget_s` (then training stops)."""

    def __init__(self, budget_s: float, every_s: float):
        self.budget_s, self.every_s = float(budget_s), float(every_s)
        self.next_save = self.every_s
        self.saved_s = 0.0

    def due(self, elapsed: float) -> tuple[bool, bool]:
        """(save now, stop now) at training time `elapsed` (saves already excluded)."""
        stop = elapsed >= self.budget_s
        return stop or elapsed >= self.next_save, stop

    def saved(self, elapsed: float, seconds: float) -> None:
        """A save at `elapsed` took `seconds`: move the schedule past `elapsed`."""
        self.saved_s += seconds
        while self.next_save <= elapsed:
            self.next_save += self.every_s


def save_checkpoint(model: Any, tokenizer: Any, root: Path, index: int, meta: dict[str, Any],
                    registry: list[dict[str, Any]]) -> float:
    """Write `model` + `tokenizer` to ROOT/ckpt_NN (a Hugging Face model dir), append `meta`
    (with its path) to `registry` and rewrite ROOT/checkpoints.json. Returns the seconds taken."""
    t0 = time.perf_counter()
    path = root / f"ckpt_{index:02d}"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    registry.append({**meta, "path": str(path)})
    (root / "checkpoints.json").write_text(json.dumps(registry, indent=1))
    return time.perf_counter() - t0


def result_line(res: dict[str, Any]) -> None:
    """The worker's result as its last stdout line (`RESULT {json}`, as the vs_trl workers)."""
    print("RESULT " + json.dumps(res), flush=True)
