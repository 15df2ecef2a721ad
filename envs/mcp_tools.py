"""mcp_tools (`agentrl/MCPTools-v0`): answer questions with tools served by MCP servers.

The tools come from the MCP servers of `servers` (`env.kwargs.servers`: stdio commands or
streamable-HTTP URLs on loopback, `agentrl_tools.mcp_client.parse_servers`): each server's
`list_tools` schemas are the agent's tool schemas, and each call is the server's `call_tool`
with the tool timeout. The env is a `ToolEnv` (envs/tool_env.py) around `MCPTasksEnv`: a turn
with tool calls is answered by the tool results; a turn without one is the answer, checked
against the task's and the episode ends.

Tasks come from `dataset` (`--dataset tasks.jsonl`), one JSON object a line: `question` (str),
`answer` (a string or number, or `answers`, a list of them), optional `id` and `checker`:

- `exact` (default): the answer (what follows the last `Answer:` line, else the whole turn)
  equals a gold answer after SQuAD normalisation (case, punctuation, articles, spaces);
- `contains`: a normalised gold answer occurs in the normalised answer;
- `number`: the last number in the answer equals a gold number (relative tolerance 1e-6);
- `regex`: the stripped answer matches a gold answer as a regular expression (`re.fullmatch`);
- `MODULE:FUNCTION`: `FUNCTION(answer_text, task) -> float | bool` (the whole final turn).

Failures of a server are tool errors of that turn (a penalised, recorded step; contract 7): the
tool raised (the server's error result), the call ran past `timeout_s`, the server crashed or
hung. A server that died is restarted at the next episode's reset; one that timed out a call is
asked for its tool list there and restarted if it does not answer (`agentrl_tools.mcp_client`).
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl.env.base import TextEnv
from agentrl.env.splits import MIN_TASKS_TO_HOLD_OUT, heldout_is_train_note
from agentrl.env.splits import split_tasks as _split_tasks
from agentrl_envs.tool_env import ToolEnv
from agentrl_envs.web_qa import extract_answer, normalize_answer
from agentrl_tools.mcp_client import connection_tools, parse_servers, shared_connection
from agentrl_tools.parser import ToolCallParser

SYSTEM_PROMPT = ("Answer the question. You may call the tools. When you know the answer, reply "
                 "without a tool call as: Answer: <answer>")

CHECKERS = ("exact", "contains", "number", "regex")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _last_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def load_checker(name: str, where: str) -> Callable[[str, dict[str, Any]], float]:
    """The checker `name` (module docstring) as `fn(final_turn_text, task) -> reward`.

    Raises:
        ValueError: an unknown name, or a MODULE:FUNCTION that does not import (naming `where`).
    """
    if name in CHECKERS:
        return lambda text, task: check_answer(name, extract_answer(text), task["answers"])
    mod, sep, attr = name.partition(":")
    if not sep:
        raise ValueError(f"{where}: unknown checker {name!r}; use one of {', '.join(CHECKERS)} or MODULE:FUNCTION")
    try:
        fn = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{where}: checker {name!r} cannot be loaded: {e}") from None

    def custom(text: str, task: dict[str, Any]) -> float:
        return float(fn(text, task))

    return custom


def check_answer(kind: str, answer: str, golds: list[str]) -> float:
    """1.0 if `answer` matches a gold answer under checker `kind` (module docstring), else 0.0."""
    if kind == "exact":
        return float(any(normalize_answer(answer) == normalize_answer(g) for g in golds))
    if kind == "contains":
        return float(any(normalize_answer(g) in normalize_answer(answer) for g in golds))
    if kind == "number":
        got = _last_number(answer)
        return float(got is not None and any(
            (want := _last_number(g)) is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
            for g in golds))
    if kind == "regex":
        return float(any(re.fullmatch(g, answer.strip()) for g in golds))
    raise ValueError(f"unknown checker {kind!r}")


def load_qa_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The tasks of a JSONL file (module docstring), each as `{id, question, answers, checker}`
    (`checker` None when the line gives none).

    Raises:
        ValueError: a missing or empty file, a line that is not a JSON object, a missing
            `question` or answer, a bad checker; the message names the file and line.
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"dataset {path}: no such file (a JSONL file of {{question, answer}} records)")
    tasks: list[dict[str, Any]] = []
    for k, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        at = f"dataset {path}:{k}"
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{at}: not JSON: {e}") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("question"), str):
            raise ValueError(f"{at}: a task is a JSON object with a string 'question'")
        answers = rec.get("answers", rec.get("answer"))
        answers = answers if isinstance(answers, list) else [answers]
        if not answers or not all(isinstance(a, str | int | float) and not isinstance(a, bool) for a in answers):
            raise ValueError(f"{at}: needs 'answer' (a string or number) or 'answers' (a list of them)")
        checker = rec.get("checker")
        if checker is not None:
            load_checker(str(checker), at)
        tasks.append({"id": str(rec.get("id", f"task{len(tasks)}")), "question": rec["question"],
                      "answers": [str(a) for a in answers], "checker": checker})
    if not tasks:
        raise ValueError(f"dataset {path}: no tasks")
    return tasks


class MCPTasksEnv(TextEnv):
    """Question -> checked answer, one answer turn (the inner env of `MCPToolsEnv`).

    Args:
        tasks: task dicts of `load_qa_tasks`.
        checker: the checker of tasks that name none.
        system_prompt: the system message.

    Final step info: `answer`, `gold`, `correct`, `task_id`.
    """

    def __init__(self, tasks: list[dict[str, Any]], checker: str = "exact", system_prompt: str = SYSTEM_PROMPT):
        self._tasks = tasks
        self.default_checker = load_checker(checker, "env.kwargs.checker")
        self._checkers = {t["checker"]: load_checker(t["checker"], "task") for t in tasks if t["checker"]}
        self.system_prompt = system_prompt
        self.task: dict[str, Any] | None = None

    def tasks(self) -> list[dict[str, Any]]:
        """This split's tasks (evaluation resets task i with `options.task_index`)."""
        return list(self._tasks)

    def eval_tasks(self) -> list[dict[str, Any]]:
        """Reset kwargs of every task of this split, in file order."""
        return [{"options": {"task_index": i}} for i in range(len(self._tasks))]

    def reference_answer(self) -> str | None:
        """`Answer: <first gold answer>` for the current task (the warm start's target)."""
        return None if self.task is None else f"Answer: {self.task['answers'][0]}"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        if isinstance(options.get("task"), dict):
            t = options["task"]
            self.task = {"id": str(t.get("id", "task")), "question": str(t["question"]),
                         "answers": [str(a) for a in t.get("answers", [t.get("answer")])],
                         "checker": t.get("checker")}
        elif "task_index" in options:
            self.task = self._tasks[int(options["task_index"])]
        else:
            self.task = self._tasks[int(self.np_random.integers(len(self._tasks)))]
        messages = [{"role": "system", "content": self.system_prompt},
                    {"role": "user", "content": self.task["question"]}]
        return messages, {"task_id": self.task["id"], "question": self.task["question"]}

    def step(self, action: str):
        if self.task is None:
            raise RuntimeError("mcp_tools: call reset() before step()")
        check = self._checkers.get(self.task["checker"], self.default_checker) if self.task["checker"] \
            else self.default_checker
        try:
            reward = float(check(action, self.task))
            err = None
        except Exception as e:  # noqa: BLE001 - a failing custom checker is a recorded step
            reward, err = 0.0, f"checker failed: {type(e).__name__}: {e}"
        if not math.isfinite(reward):
            reward, err = 0.0, f"checker returned {reward}"
        info: dict[str, Any] = {"answer": extract_answer(action), "gold": self.task["answers"],
                                "correct": reward, "task_id": self.task["id"]}
        if err:
            info["error"] = err
        return [], reward, True, False, info


def split_tasks(tasks: list[dict[str, Any]], split: str, heldout: str | None) -> list[dict[str, Any]]:
    """The tasks of `split` (`train`, `heldout` or `all`; `agentrl.env.splits.split_tasks`,
    the held-out file read with `load_qa_tasks`).

    Raises:
        ValueError: an unknown split.
    """
    return _split_tasks(tasks, split, heldout, load_qa_tasks, "mcp_tools")


class MCPToolsEnv(ToolEnv):
    """Question answering with the tools of MCP servers (module docstring).

    Args:
        dataset: JSONL task file (`--dataset`).
        servers: the MCP servers (`agentrl_tools.mcp_client.parse_servers`).
        split: `train`, `heldout` or `all` (`split_tasks`).
        heldout: a JSONL file of held-out tasks (then `dataset` is all training tasks).
        checker: the checker of tasks that name none (module docstring).
        parser: tool-call format (`rollout.tool_parser` when not set here).
        timeout_s: wall-clock limit per tool call, seconds.
        max_tool_calls, tool_call_penalty, tool_error_penalty, tools_in_prompt, max_output_chars:
            as for `ToolEnv`.
        connect_timeout_s: seconds for a server to start and list its tools.
        system_prompt: the system message (the tool list is appended when `tools_in_prompt`).

    Info: `ToolEnv`'s (`tool_calls`, `tool_errors`, `tool_error_kinds`, and on a failed call
    `error`), `MCPTasksEnv`'s on the answer turn; reset info adds `mcp_restarts` (servers
    restarted by this reset).

    Raises:
        ValueError: no dataset or servers, a bad task file or server entry, an empty split,
            two servers with a tool of the same name (give one a `prefix`), or a server that
            does not start (naming it, with its stderr).
    """

    def __init__(self, dataset: str | None = None, servers: Any = None, *, split: str = "train",
                 heldout: str | None = None, checker: str = "exact",
                 parser: str | ToolCallParser = "hermes", timeout_s: float = 10.0,
                 max_tool_calls: int = 8, tool_call_penalty: float = 0.0, tool_error_penalty: float = 0.0,
                 tools_in_prompt: bool = True, max_output_chars: int = 8000,
                 connect_timeout_s: float = 30.0, system_prompt: str = SYSTEM_PROMPT):
        if dataset is None:
            raise ValueError("env mcp_tools: give the task file (--dataset tasks.jsonl)")
        every = load_qa_tasks(dataset)
        tasks = split_tasks(every, split, heldout)
        self.dataset = dataset
        self.n_tasks = len(every)
        self.heldout_is_train = heldout is None and len(every) < MIN_TASKS_TO_HOLD_OUT
        if not tasks:
            raise ValueError(f"env mcp_tools: split {split!r} of {dataset} has no tasks")
        specs = parse_servers(servers)
        try:
            self.connections = [shared_connection(s, connect_timeout_s) for s in specs]
        except ConnectionError as e:
            raise ValueError(f"env.kwargs.servers: {e}") from None
        tools, owner = [], {}
        for conn in self.connections:
            for t in connection_tools(conn, timeout_s):
                if t.name in owner:
                    raise ValueError(f"env.kwargs.servers: servers {owner[t.name]!r} and {conn.spec.name!r} "
                                     f"both offer a tool {t.name!r}; give one a 'prefix'")
                owner[t.name] = conn.spec.name
                tools.append(t)
        super().__init__(MCPTasksEnv(tasks, checker, system_prompt), tools, parser=parser,
                         max_tool_calls=max_tool_calls, timeout_s=timeout_s,
                         tool_call_penalty=tool_call_penalty, tool_error_penalty=tool_error_penalty,
                         tools_in_prompt=tools_in_prompt, max_output_chars=max_output_chars)

    def startup_notes(self) -> list[str]:
        """The `[run]` line's (and `agentrl eval`'s) warning when the held-out tasks are the
        training tasks (fewer than 5 tasks and no `heldout` file)."""
        return [heldout_is_train_note(self.n_tasks, self.dataset)] if self.heldout_is_train else []

    def reference_answer(self) -> str | None:
        """The inner env's `Answer: <gold>` (the warm start's target: the answer format; which
        tool calls lead to it is the server's business, unknown here)."""
        return self.env.unwrapped.reference_answer()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        restarts = 0
        for conn in self.connections:  # a server that died (or hung) last episode starts again
            before = conn.starts
            conn.ensure_alive()
            restarts += conn.starts - before
        messages, info = super().reset(seed=seed, options=options)
        return messages, {**info, "mcp_restarts": restarts}
