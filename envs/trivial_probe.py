"""Reward-hacking guard: which coding tasks does a trivial solution pass? (issue 42, item 8)

Each task is run in the sandbox against a handful of trivial solutions of its entry point: the
constants True, False, 0, 1, None (also what an empty body returns), "" and [], and the first
argument (identity). A task that one of them passes rewards an answer that ignores the problem
(MBPP+ Mbpp/164 passes `return True`, Mbpp/295 `return 0`, Mbpp/404 `lambda *a: a[0]`), so the
code env leaves it out of training or flags it (`CodeSandboxEnv(trivial_tasks=...)`).

The probes of all tasks run in parallel on a sandbox pool, and their results are cached on disk
(`cache_dir()`, one small JSON file per task, keyed on a SHA-256 of everything that decides the
verdict: the task's tests, setup, prefix, entry point, limits and the probe set), so a dataset
is probed once per machine; a task whose probes failed to run (a sandbox error) is not cached.
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

#: probe name -> the body of `def <entry>(*args, **kwargs):`
PROBES: dict[str, str] = {
    "return True": "return True", "return False": "return False", "return 0": "return 0",
    "return 1": "return 1", "return None (empty body)": "return None", 'return ""': 'return ""',
    "return []": "return []", "return first argument": "return args[0] if args else None",
}
PROBE_VERSION = 1
#: limits of one probe run: a trivial solution needs little; a slow test is cut short (a
#: timeout is not a pass, so it never flags a task)
PROBE_LIMITS = Limits(wall_s=5.0, cpu_s=5.0)


def cache_dir() -> Path:
    """`$AGENTRL_CACHE_DIR/trivial_probe`, default `~/.cache/agentrl/trivial_probe`."""
    return jsoncache_dir("trivial_probe")


def probe_code(entry_point: str, body: str) -> str:
    """A solution defining `entry_point` with `body`."""
    return f"def {entry_point}(*args, **kwargs):\n    {body}\n"


def task_key(task: CodeTask, limits: Limits) -> str:
    """SHA-256 of what decides a probe's verdict on `task`."""
    blob = json.dumps({"v": PROBE_VERSION, "probes": PROBES, "tests": list(task.tests), "setup": task.setup,
                       "prefix": task.prefix, "entry": task.entry_point, "limits": limits.to_dict(),
                       "time": task.time_limit, "mem": task.memory_mb}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _load(path: Path) -> list[str] | None:
    """The cached names of the probes that pass (None: none, or an unreadable record)."""
    passed = (load_record(path) or {}).get("passed")
    return [str(p) for p in passed] if isinstance(passed, list) else None


def probe_tasks(tasks: Sequence[CodeTask], pool: SandboxPool,
                make_job: Callable[[CodeTask, str, Limits], dict[str, Any]], *,
                limits: Limits = PROBE_LIMITS, use_cache: bool = True) -> dict[str, list[str]]:
    """Run the trivial solutions of `PROBES` against every task.

    Args:
        make_job: (task, code, limits) -> `run_tests` keyword arguments
            (`code_sandbox.sandbox_job`: the env's own way to run an answer).

    Returns:
        {task_id: names of the probes that pass it} for the tasks some probe passes (the
        trivially passable ones); an empty dict when none is.
    """
    out: dict[str, list[str]] = {}
    todo: list[tuple[CodeTask, Path]] = []
    for task in tasks:
        path = cache_dir() / f"{task_key(task, limits)}.json"
        hit = _load(path) if use_cache else None
        if hit is None:
            todo.append((task, path))
        elif hit:
            out[task.task_id] = hit
    jobs: list[dict[str, Any]] = []
    for task, _ in todo:
        for body in PROBES.values():
            jobs.append(make_job(task, probe_code(task.entry_point, body), limits))
    results = pool.map_tests(jobs) if jobs else []
    for k, (task, path) in enumerate(todo):
        rs = results[k * len(PROBES):(k + 1) * len(PROBES)]
        passed = [name for name, r in zip(PROBES, rs) if r.verdict == "pass"]
        if passed:
            out[task.task_id] = passed
        if not any(r.verdict == "sandbox_error" for r in rs):
            store_record(path, {"task_id": task.task_id, "passed": passed})
    return out
