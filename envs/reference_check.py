"""Do the reference solutions pass their own tests? (issue 42, item 11)

The warm start trains on each task's reference solution (`CodeSandboxEnv.reference_answer`),
so a reference that fails its tests (a broken record, a test that contradicts the solution)
teaches a wrong answer. Before the warm start, every reference of a task list is run against
its tests in the sandbox, in parallel on a sandbox pool, as the env would run it as an answer
(`code_sandbox.sandbox_job` of `extract_code(reference)`, with the env's limits); a task whose
reference does not pass is left out of the warm start and counted.

Verdicts are cached on disk (`cache_dir()`, one small JSON file per task, keyed on a SHA-256 of
everything that decides the verdict: the reference, the task's tests, setup, prefix, entry
point and limits), so a dataset is checked once per machine; a run whose verdict is
`sandbox_error` (the sandbox's failure, not the reference's) or `timeout` (load-dependent) is
not cached. The static check
(`code_datasets.reference_problems`: compiles, defines the entry point) still runs first, at
the CLI's load of `--dataset`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.infra.jsoncache import cache_dir as jsoncache_dir
from agentrl.infra.jsoncache import load_record, store_record
from agentrl.sandbox import Limits, SandboxPool
from agentrl_envs.code_datasets import CodeTask

CHECK_VERSION = 1
UNCACHED = ("sandbox_error", "timeout")
"""Verdicts not cached: the sandbox's own failure, and a time limit hit (on a loaded machine a
slow reference may pass next time; a cached timeout would leave it out for good)."""


def cache_dir() -> Path:
    """`$AGENTRL_CACHE_DIR/reference_check`, default `~/.cache/agentrl/reference_check`."""
    return jsoncache_dir("reference_check")


def task_key(task: CodeTask, code: str, limits: Limits) -> str:
    """SHA-256 of what decides the verdict of `code` (the reference as run) on `task`."""
    blob = json.dumps({"v": CHECK_VERSION, "code": code, "tests": list(task.tests), "setup": task.setup,
                       "prefix": task.prefix, "entry": task.entry_point, "limits": limits.to_dict(),
                       "time": task.time_limit, "mem": task.memory_mb}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _load(path: Path) -> str | None:
    """The cached verdict at `path` (None: none, or an unreadable record)."""
    verdict = (load_record(path) or {}).get("verdict")
    return verdict if isinstance(verdict, str) else None


def check_references(tasks: Sequence[CodeTask], pool: SandboxPool,
                     make_job: Callable[[CodeTask, str, Limits], dict[str, Any]],
                     code_of: Callable[[str], str], limits: Limits, *,
                     use_cache: bool = True) -> dict[str, str]:
    """Run every task's reference solution against its tests (tasks without one are skipped).

    Args:
        make_job: (task, code, limits) -> `run_tests` keyword arguments (`code_sandbox.sandbox_job`).
        code_of: the code the env runs for an answer text (`code_sandbox.extract_code`).
        limits: the env's sandbox limits (a task's own time and memory limits apply on top).

    Returns:
        {task_id: verdict} of the tasks whose reference does not pass (`fail`,
        `runtime_error`, `timeout`, ..., or `sandbox_error` when the sandbox itself failed);
        an empty dict when every reference passes.
    """
    bad: dict[str, str] = {}
    todo: list[tuple[CodeTask, str, Path]] = []
    for task in tasks:
        if not task.solution:
            continue
        code = code_of(task.solution.rstrip("\n"))
        path = cache_dir() / f"{task_key(task, code, limits)}.json"
        hit = _load(path) if use_cache else None
        if hit is None:
            todo.append((task, code, path))
        elif hit != "pass":
            bad[task.task_id] = hit
    results = pool.map_tests([make_job(t, code, limits) for t, code, _ in todo]) if todo else []
    for (task, _, path), r in zip(todo, results, strict=True):
        if r.verdict != "pass":
            bad[task.task_id] = r.verdict
        if r.verdict not in UNCACHED:
            store_record(path, {"task_id": task.task_id, "verdict": r.verdict})
    return bad
