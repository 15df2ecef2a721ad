"""The user's agent as the environment: `agentrl train --agent MODULE:FUNCTION --dataset
tasks.jsonl`, where `async def FUNCTION(client, task)` gets an `openai.AsyncOpenAI` client on
the gateway (its API key the run's token) and one task record, and returns the reward (a number,
or a dict with `"reward"` and other numbers, kept as metrics).

`AgentEnv` (registered as `agentrl/Agent-v0`, short name `agent`) holds the agent function and
the tasks. Its episodes do not run in the agent loop: the env's batch hook `run_agents` (called
by `agentrl.rollout.collect.collect` and by the evaluation harness) runs one agent per episode,
each on its own thread (threads are kept for later batches: `_Workers`) with its own event
loop, while the calling thread drives the gateway's session (it calls the engine). Each run's
calls become trajectories (`agentrl.gateway.record`).

Contract 7: an agent that raises, returns something that is not a reward, makes a request the
gateway refuses, never calls the gateway, or hangs (no call and no return for
`env.step_timeout_s` seconds: a coroutine is cancelled, a thread that blocks is abandoned) ends
its own run as a recorded error (reward `error_reward`, `info["error"]`); the others go on.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import json
import math
import os
import queue
import socket
import ssl
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

from agentrl.env.base import TextEnv
from agentrl.env.splits import MIN_TASKS_TO_HOLD_OUT, heldout_is_train_note, split_tasks
from agentrl.gateway.server import RunState, Session, shared_gateway
from agentrl.rollout.engines.base import SamplingParams
from agentrl.types import Trajectory
from agentrl_tools.parser import get_parser

MODEL_NAME = "policy"
"""The model name agents ask for (`model="policy"`); `GET /v1/models` lists it."""

_SSL = ssl.create_default_context()  # one context for every run's client (making one costs ~50 ms)
NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
"""The client's socket option: without it Nagle holds a request's body behind its headers for
the server's delayed ACK (up to 40 ms a call on a kept-alive connection)."""


def load_agent(spec: str) -> Callable[..., Any]:
    """The agent function named `MODULE:FUNCTION` (the module imported from `sys.path`, the
    current folder included).

    Raises:
        ValueError: the spec is not `MODULE:FUNCTION`, the module or the function is missing, or
            the function is not `async def FUNCTION(client, task)`.
    """
    mod_name, sep, fn_name = str(spec).partition(":")
    if not sep or not mod_name or not fn_name:
        raise ValueError(f"agent {spec!r}: give MODULE:FUNCTION, e.g. my_agent:solve")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        top = mod_name.split(".")[0]
        hint = (f" (modules are looked up in the current folder {os.getcwd()} and on sys.path: run from "
                f"the folder that holds {top}.py, or add that folder to PYTHONPATH)"
                if isinstance(e, ModuleNotFoundError) and e.name == top else "")
        raise ValueError(f"agent {spec!r}: cannot import module {mod_name!r}: {e}{hint}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise ValueError(f"agent {spec!r}: module {mod_name!r} has no {fn_name!r}")
    call = type(fn).__call__ if not inspect.isroutine(fn) and callable(fn) else None
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)):
        raise ValueError(f"agent {spec!r} is not async: define it as `async def {fn_name}(client, "
                         "task)` (it is awaited with an openai.AsyncOpenAI client)")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise ValueError(f"agent {spec!r}: it must take two arguments (client, task)") from None
    except ValueError:  # no signature to read: called as it is
        pass
    return fn


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The task records of a JSONL file (one JSON object a line; blank lines skipped).

    Raises:
        ValueError: the file is missing, empty, or a line is not a JSON object (naming the line).
    """
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"dataset {path}: no such file (a JSONL file of task records)")
    tasks = []
    for k, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ValueError(f"dataset {path}:{k}: not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"dataset {path}:{k}: a task must be a JSON object, got {type(obj).__name__}")
        tasks.append(obj)
    if not tasks:
        raise ValueError(f"dataset {path}: no tasks")
    return tasks


def reward_of(value: Any) -> tuple[float, dict[str, float]]:
    """`(reward, metrics)` of what an agent returned: a number, or a dict with a number
    `"reward"` and other numbers (metrics; non-numbers are dropped).

    Raises:
        TypeError: anything else, or a reward that is not finite.
    """
    metrics: dict[str, float] = {}
    if isinstance(value, dict):
        if "reward" not in value:
            raise TypeError(f"the agent returned a dict without 'reward' (keys {sorted(value)[:8]})")
        metrics = {str(k): float(v) for k, v in value.items()
                   if k != "reward" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"the agent returned {type(value).__name__} {str(value)[:60]!r}, not a "
                        "number (or a dict with a number 'reward')")
    if not math.isfinite(float(value)):
        raise TypeError(f"the agent returned a reward that is not finite: {value}")
    return float(value), metrics


class AgentEnv(TextEnv):
    """The user's agent function over a task file (module docstring).

    Args:
        agent: `MODULE:FUNCTION` of `async def FUNCTION(client, task) -> float | dict`.
        dataset: a JSONL file of task records (`--dataset`).
        split: "train", "heldout" or "all" (`agentrl.env.splits.split_tasks`): with `heldout`
            unset, every fifth task (index 4, 9, ...) is held out when there are 5 or more, else
            both splits are all the tasks (a warning in the start-up line, `startup_notes`);
            "all" is every task of `dataset`.
        heldout: a JSONL file of held-out tasks (then `dataset` is all training tasks).
        tool_parser: the model's tool-call format (`agentrl_tools.parser.get_parser`).

    Raises:
        ValueError: a bad agent (`load_agent`), a bad task file (`load_tasks`), no dataset, an
            unknown tool parser, an unknown split, or an empty split.
    """

    def __init__(self, agent: str = "", dataset: str | None = None, split: str = "train",
                 heldout: str | None = None, tool_parser: str = "hermes"):
        if not agent:
            raise ValueError("env agent: give the agent function (--agent MODULE:FUNCTION)")
        if dataset is None:
            raise ValueError("env agent: give the task file (--dataset tasks.jsonl)")
        self.agent_spec = agent
        self.agent = load_agent(agent)
        self.parser = get_parser(tool_parser)
        tasks = load_tasks(dataset)
        # too few to hold any out: the held-out tasks are the training tasks (said at start-up)
        self.heldout_is_train = heldout is None and len(tasks) < MIN_TASKS_TO_HOLD_OUT
        self.dataset = dataset
        self._tasks = split_tasks(tasks, split, heldout, load_tasks, "env agent")
        self.task: dict[str, Any] | None = None

    def startup_notes(self) -> list[str]:
        """The warning of the run's `[run]` line and `agentrl eval`'s line when the held-out
        tasks are the training tasks (fewer than 5 tasks and no `heldout` file): its held-out
        figures then measure the tasks it trained on."""
        if not self.heldout_is_train:
            return []
        return [heldout_is_train_note(len(self._tasks), self.dataset)]

    def tasks(self) -> list[dict[str, Any]]:
        """The task records of this split (evaluation resets task i with `options.task_index`)."""
        return list(self._tasks)

    def task_for(self, seed: int | None = None, options: dict[str, Any] | None = None
                 ) -> tuple[dict[str, Any], str]:
        """The task record a reset with `seed` / `options` plays, and its id (`task["id"]`, else
        `task<index>`): `options["task"]` (a record), `options["task_index"]`, else task
        `seed mod len(tasks)` (seed None: task 0)."""
        options = options or {}
        if isinstance(options.get("task"), dict):
            t = options["task"]
            return t, str(t.get("id", "task"))
        i = int(options["task_index"]) if "task_index" in options else int(seed or 0) % len(self._tasks)
        t = self._tasks[i]
        return t, str(t.get("id", f"task{i}"))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.task, task_id = self.task_for(seed, options)
        return [{"role": "user", "content": json.dumps(self.task, ensure_ascii=False)}], {"task_id": task_id}

    def step(self, action: str):
        return [], 0.0, True, False, {"note": "the agent env's episodes run through the gateway "
                                              "(run_agents), not step"}

    def run_agents(self, engine: Any, renderer: Any, specs: Sequence[Any], params: SamplingParams, *,
                   max_episode_tokens: int, seed: int | None = None, timeout_s: float | None = None,
                   error_reward: float = 0.0, one_per_run: bool = False) -> list[Trajectory]:
        """Run one agent per spec (`spec.reset_kwargs` picks the task, `spec.group_id` its
        group) against the gateway, sampling from `engine` on this thread; returns the runs'
        trajectories, in spec order (a run that extended one conversation: one trajectory; one
        that rewrote its context: one per conversation; one that made no call: an empty one).

        Args:
            params: `temperature` and `top_p` every call samples with; `max_tokens` the most new
                ids per call.
            max_episode_tokens: the most ids of a call's prompt and completion.
            seed: the session's sampler seed.
            timeout_s: a run with no call and no return for this long ends as timed out.
            one_per_run: one trajectory per spec (evaluation): a run's last conversation, the
                count of all its samples in `info["agent_samples"]`.
        """
        gw = shared_gateway()
        session = Session(engine, renderer, self.parser, model_names=[MODEL_NAME],
                          max_episode_tokens=max_episode_tokens, max_tokens=params.max_tokens,
                          sampling=(params.temperature, params.top_p), seed=seed)
        jobs = []
        for spec in specs:
            kw = dict(spec.reset_kwargs)
            task, task_id = self.task_for(kw.get("seed"), kw.get("options"))
            run = gw.open_run(session)
            jobs.append(_Job(run, task_id, int(spec.group_id), self.agent, task, gw.url))
        version = int(getattr(engine, "policy_version", 0))
        t0 = time.perf_counter()
        for j in jobs:
            j.start()
        try:
            session.drive(lambda: all(j.done.is_set() for j in jobs),
                          on_tick=lambda: _watch(jobs, timeout_s))
        finally:
            for j in jobs:
                gw.close_run(j.run)
            session.fail_waiting()
        env_s = env_shares(jobs, time.perf_counter() - t0 - session.generate_s)
        out = [j.trajectories(error_reward, version, e) for j, e in zip(jobs, env_s)]
        if one_per_run:
            for trs in out:
                trs[-1].info["agent_samples"] = len(trs)
            return [trs[-1] for trs in out]
        return [tr for trs in out for tr in trs]


def env_shares(jobs: Sequence[_Job], env_s: float) -> list[float]:
    """The batch's env seconds `env_s` (its wall time outside generate calls: the agents' own
    work, tools, parsing, HTTP, while the driving thread waited for them) split over its runs
    in proportion to each run's own wall time outside its generate calls (equal shares when
    none has any). The shares add up to `env_s`, so that `perf/env_s` (the sum over a step's
    episodes) is wall time of the step, as for a `TextEnv` (whose concurrent steps count once),
    not the agents' thread time summed over concurrent runs."""
    env_s = max(0.0, env_s)
    own = [max(0.0, (j.t_end - j.t_start) - j.run.generate_s) for j in jobs]
    total = sum(own)
    if total <= 0.0:
        return [env_s / max(len(jobs), 1)] * len(jobs)
    return [env_s * o / total for o in own]


def _watch(jobs: list[_Job], timeout_s: float | None) -> None:
    """End the runs idle (no request in the gateway) for more than `timeout_s` seconds."""
    if timeout_s is None:
        return
    now = time.monotonic()
    for j in jobs:
        r = j.run
        if not j.done.is_set() and r.pending == 0 and now - r.last_active > timeout_s:
            j.abandon(f"the agent timed out: no call to the gateway and no return for {timeout_s:g} s")


class _Job:
    """One agent run on its own thread (its own event loop), and its outcome."""

    def __init__(self, run: RunState, task_id: str, group_id: int, fn: Any, task: dict[str, Any], url: str):
        self.run, self.task_id, self.group_id, self.fn, self.task, self.url = run, task_id, group_id, fn, task, url
        self.done = threading.Event()
        self.value: Any = None
        self.error: str | None = None
        self.timed_out = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._lock = threading.Lock()
        self.t_start = self.t_end = 0.0

    def start(self) -> None:
        self.t_start = time.perf_counter()
        _WORKERS.run(self._main)

    async def _agent(self) -> Any:
        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        transport = httpx.AsyncHTTPTransport(verify=_SSL, socket_options=NODELAY)
        async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(3600.0)) as http:
            client = openai.AsyncOpenAI(base_url=self.url, api_key=self.run.token, max_retries=0,
                                        http_client=http)
            return await self.fn(client, copy.deepcopy(self.task))

    def _main(self) -> None:
        try:
            value, error = asyncio.run(self._agent()), None
        except BaseException as e:  # noqa: BLE001 - contract 7: the agent's failure is recorded
            value, error = None, _short_error(e)
        self._end(value, error)

    def _end(self, value: Any, error: str | None, timed_out: bool = False) -> None:
        with self._lock:
            if self.done.is_set():
                return
            self.value, self.error, self.timed_out = value, error, timed_out
            self.t_end = time.perf_counter()
            self.done.set()
        self.run.finish()  # the driving thread rechecks at once (not at its next 50 ms tick)

    def abandon(self, reason: str) -> None:
        """End the run now as timed out: its coroutine is cancelled (a thread that blocks is
        left to itself, a daemon), its token refused from now on."""
        self._end(None, reason, timed_out=True)
        self.run.live = False
        if self._loop is not None and self._task is not None:
            try:
                self._loop.call_soon_threadsafe(self._task.cancel)
            except RuntimeError:  # the loop has closed meanwhile
                pass

    def trajectories(self, error_reward: float, version: int, env_s: float) -> list[Trajectory]:
        """The run's trajectories with its reward (or `error_reward` and `info["error"]`);
        `timings`: the run's seconds in generate calls (its share of each) and its share of the
        batch's env seconds `env_s` (`env_shares`), split over its trajectories."""
        info: dict[str, Any] = {"agent_calls": self.run.calls}
        error = self.error or self.run.failed
        reward = error_reward
        if error is None:
            try:
                reward, metrics = reward_of(self.value)
                if metrics:
                    info["agent_metrics"] = metrics
            except TypeError as e:
                error = str(e)
        if error is None and self.run.calls == 0:
            error, reward = "the agent never called the gateway", error_reward
        if error is not None:
            info["error"] = error
            info["agent_error"] = True
        if self.timed_out:
            info["env_timeout"] = "agent"
        if self.run.refusals:
            info["gateway_refusals"] = list(self.run.refusals)
        if self.run.truncated:
            info["truncated_by"] = "max_episode_tokens"
        assert self.run.record is not None
        trajs = self.run.record.trajectories(reward, group_id=self.group_id, task_id=self.task_id, info=info)
        if not trajs:  # no call: an empty, recorded episode (as a failed reset)
            trajs = [Trajectory(group_id=self.group_id, task_id=self.task_id, terminated=True,
                                policy_version=version, info={**info, "num_turns": 0})]
        for tr in trajs:
            tr.truncated = self.run.truncated
            tr.terminated = not self.run.truncated
            tr.timings = {"generate": self.run.generate_s / len(trajs),
                          "env": env_s / len(trajs)}
        return trajs


class _Workers:
    """Daemon threads that run agent runs, one at a time each, kept for the next batch
    (starting a thread costs the driving thread about 0.1 ms of CPU, a hand-off a few us): a
    run gets an idle thread, else a new one; a thread whose run blocks (abandoned) stays with
    it until it returns; an idle thread ends after `idle_s` seconds."""

    def __init__(self, idle_s: float = 60.0):
        self.idle_s = idle_s
        self._idle: list[queue.SimpleQueue] = []
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], None]) -> None:
        """Call `fn()` on an idle thread, or a new one (`fn` must not raise)."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="agentrl-agent", daemon=True).start()
        inbox.put(fn)

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            try:
                fn = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if inbox in self._idle:  # else a run was just handed to this thread
                        self._idle.remove(inbox)
                        return
                continue
            fn()
            with self._lock:
                self._idle.append(inbox)


_WORKERS = _Workers()


def _short_error(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    where = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return f"agent raised {type(e).__name__}: {e}{where}"[:500]
