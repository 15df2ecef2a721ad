"""`self_propose`: the agent poses small coding tasks, solves buffered ones, and the sandbox
verifies everything (after Absolute Zero, Zhao et al. 2025). docs/self_propose.md has the
formats, the rewards and how the proposer's learnability reward is computed in the loop.

One episode is one turn in one role, drawn from the reset seed (so every episode of a GRPO
group has the same role, mode and task):

- *propose* (probability `propose_fraction`): shown `num_examples` buffered tasks, write
  ```python def f(x): ...``` and 1..6 lines `Input: <literal>`. The sandbox runs it twice;
  a valid, deterministic, non-trivial, new task enters the buffer. Reward: `invalid_reward`
  for a rejected proposal; a valid one gets 0 from `step` and its learnability (plus, with
  `novelty_coef > 0`, a count-based novelty bonus) from `finish_batch` (called by the collector
  after the batch's solve episodes).
- *solve*, mode `deduce` (program + input -> `Output: <literal>`), `abduce` (program + output ->
  `Input: <literal>`) or `induce` (visible input/output pairs + a description -> a program that
  must also match the held-out pairs). Reward 1.0 when right, else 0.0.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np

from agentrl.env.base import TextEnv
from agentrl.rewards.curiosity import ngram_buckets
from agentrl.sandbox import Limits, SandboxPool
from agentrl.sandbox.pool import default_pool
from agentrl_envs.self_propose_tasks import (
    ALLOWED_IMPORTS,
    HELDOUT_TASKS,
    SEED_TASKS,
    ParseError,
    Task,
    TaskBuffer,
    docstring,
    harness,
    normalise,
    parse_labelled_value,
    parse_program,
    parse_proposal,
    read_outputs,
    shared_buffer,
    task_key,
    trivial_reason,
)

MODES = ("deduce", "abduce", "induce")
ROLES = ("propose", "solve")
NOVELTY_N, NOVELTY_TABLE = 2, 1 << 16  # the curiosity bonus's count-based defaults
SYSTEM_PROMPT = "You write and solve small Python tasks. Follow the answer format exactly."


def role_of(seed: int, propose_fraction: float) -> str:
    """The role of the episodes reset with `seed`: `propose` with probability
    `propose_fraction` (from `default_rng([seed, 1])`, independent of the task draw)."""
    return "propose" if np.random.default_rng([int(seed), 1]).random() < propose_fraction else "solve"


@lru_cache(maxsize=4096)
def program_buckets(src: str) -> frozenset[int]:
    """The hashed word bigrams of a program's normalised source (`normalise`: comments and
    formatting dropped), as the curiosity bonus counts a response
    (`agentrl.rewards.curiosity.ngram_buckets`, n=2, 2**16 buckets)."""
    return frozenset(int(b) for b in ngram_buckets(normalise(src), NOVELTY_N, NOVELTY_TABLE))


def program_novelty(src: str, buffer_srcs: list[str]) -> float:
    """Count-based novelty of program `src` against the programs `buffer_srcs` (the buffer's,
    `src` itself included when it is there): mean over the buckets b of `src` of N[b]**-0.5,
    N[b] = how many of `buffer_srcs` contain b (at least 1: `src` counts itself). 1.0 for a
    program sharing no bigram with the others; 0.0 for one with no words."""
    mine = program_buckets(src)
    if not mine:
        return 0.0
    counts = Counter(b for s in buffer_srcs for b in program_buckets(s) if b in mine)
    return float(np.mean([max(counts[b], 1) ** -0.5 for b in sorted(mine)]))


def show_task(t: Task, i: int = 0) -> str:
    return f"```python\n{t.src}\n```\nInput: {t.inputs[i]}\nOutput: {t.outputs[i]}"


class SelfProposeEnv(TextEnv):
    """Propose deterministic Python tasks and solve buffered ones, verified in the sandbox.

    Args:
        propose_fraction: share of episodes (by reset seed) in the propose role, in [0, 1].
        modes: the solve modes drawn from (subset of `deduce`, `abduce`, `induce`).
        num_examples: buffered tasks shown to the proposer.
        invalid_reward: reward of a rejected proposal (invalid, non-deterministic, trivial,
            duplicate).
        buffer_cap: most tasks in the buffer (seed tasks included).
        buffer: name of the process-wide buffer this env shares (the run's env copies share
            `default`); or a `TaskBuffer` object.
        split: `train` (both roles) or `heldout`/`test` (evaluation: `eval_tasks()` lists
            deduce episodes on `HELDOUT_TASKS`, never in the buffer).
        limits: sandbox limits (`Limits` or a dict of its fields; default 2 s, 256 MiB).
        backend, pool: as in `code_sandbox`.
        allowed_imports: modules programs may import (default `ALLOWED_IMPORTS`: pure
            computation; the sandbox is the real boundary, this keeps tasks deterministic).
        novelty_coef: weight of the proposer's novelty bonus (>= 0; 0, the default, turns it
            off): `finish_batch` adds `novelty_coef * program_novelty(program, buffer)` to each
            valid proposal's reward, the count-based bonus of `agentrl.rewards.curiosity` over
            the programs in the buffer.

    Raises:
        ValueError: a bad argument, naming it.
    """

    def __init__(self, propose_fraction: float = 0.5, modes: list[str] | None = None,
                 num_examples: int = 3, invalid_reward: float = -0.5, buffer_cap: int = 256,
                 buffer: str | TaskBuffer = "default", split: str = "train",
                 limits: Limits | dict[str, Any] | None = None, backend: str = "auto",
                 pool: SandboxPool | None = None, allowed_imports: list[str] | None = None,
                 novelty_coef: float = 0.0):
        if not 0.0 <= propose_fraction <= 1.0:
            raise ValueError(f"propose_fraction: must be in [0, 1], got {propose_fraction}")
        modes = list(modes or MODES)
        bad = [m for m in modes if m not in MODES]
        if bad or not modes:
            raise ValueError(f"modes: unknown {bad or modes}; allowed: {', '.join(MODES)}")
        if num_examples < 0:
            raise ValueError(f"num_examples: must be >= 0, got {num_examples}")
        if split not in ("train", "heldout", "test"):
            raise ValueError(f"split: unknown {split!r}; allowed: train, heldout, test")
        if not math.isfinite(invalid_reward):
            raise ValueError(f"invalid_reward: must be finite, got {invalid_reward}")
        if not (math.isfinite(novelty_coef) and novelty_coef >= 0):
            raise ValueError(f"novelty_coef: must be finite and >= 0, got {novelty_coef}")
        self.novelty_coef = float(novelty_coef)
        self.propose_fraction = float(propose_fraction)
        self.modes = modes
        self.num_examples = int(num_examples)
        self.invalid_reward = float(invalid_reward)
        self.split = "heldout" if split == "test" else split
        self.buffer = buffer if isinstance(buffer, TaskBuffer) else shared_buffer(buffer, buffer_cap)
        self.limits = limits if isinstance(limits, Limits) else Limits(
            **{"wall_s": 2.0, "cpu_s": 2.0, "memory_mb": 256, **(limits or {})})
        self.allowed = frozenset(ALLOWED_IMPORTS if allowed_imports is None else allowed_imports)
        self.backend = backend
        if pool is None:
            from agentrl.sandbox.pool import resolve_backend

            resolve_backend(backend)
        self._pool = pool
        self.role: str | None = None
        self.mode: str | None = None
        self.task: Task | None = None
        self.pair = 0
        self._done = False
        self._reference: str | None = None

    # -- loop hooks (agentrl.rollout.collect) ----------------------------------------------------
    def batch_phases(self, seeds: list[int]) -> list[list[int]]:
        """The order in which the collector runs a batch's groups: the propose seeds first,
        then the solve seeds (indices into `seeds`), so that this batch's solve groups see its
        fresh proposals. Each solve group gets `options={"slot": k}` (its place in its phase):
        slot k solves the k-th fresh task (by key), or a drawn buffered task when k is past
        them."""
        props = [i for i, s in enumerate(seeds) if role_of(s, self.propose_fraction) == "propose"]
        solves = [i for i, s in enumerate(seeds) if role_of(s, self.propose_fraction) == "solve"]
        return [p for p in (props, solves) if p]

    def finish_batch(self, trajs: list[Any]) -> None:
        """Give each valid proposal of the batch its learnability reward and clear the fresh
        list. The solve rate of a task is the mean success of the batch's solve episodes on it
        (its solver group); learnability is `1 - rate` when `0 < rate < 1`, else 0 (also 0, with
        `info["unscored"]`, when no solve episode of the batch ran it). Added to the proposer's
        last-turn reward (which `step` left at 0 plus any wrapper shaping), and with
        `novelty_coef > 0` the novelty bonus `novelty_coef * program_novelty(program, the
        buffer's programs)` (the buffer as it is now, this batch's valid proposals included, so
        the bonus does not depend on the order the proposals were made in). Also sets
        `env_stats["proposal_diversity"]` on every trajectory when the batch has valid
        proposals: distinct normalised programs (inputs ignored) / valid proposals."""
        rates: dict[str, list[float]] = {}
        srcs: list[str] = []
        if self.novelty_coef > 0:
            with self.buffer.lock:
                srcs = [b.src for b in self.buffer.tasks]
        for t in trajs:
            if t.info.get("role") == "solve" and t.turns:
                rates.setdefault(t.info["task_key"], []).append(float(bool(t.turns[-1].info.get("success"))))
        for t in trajs:
            if t.info.get("role") != "propose" or not t.turns:
                continue
            last = t.turns[-1]
            if not last.info.get("proposal_valid"):
                continue
            got = rates.get(last.info["task_key"])
            rate = float(np.mean(got)) if got else None
            score = 1.0 - rate if rate is not None and 0.0 < rate < 1.0 else 0.0
            last.reward += score
            last.info.update({"solve_rate": rate, "learnability": score, "unscored": got is None})
            if self.novelty_coef > 0:
                bonus = self.novelty_coef * program_novelty(last.info["program"], srcs)
                last.reward += bonus
                comps = dict(last.info.get("reward_components") or {})
                comps["novelty"] = bonus  # logged as reward/novelty (per episode of the batch)
                last.info.update({"novelty": bonus, "reward_components": comps})
        progs = [t.turns[-1].info["program_key"] for t in trajs if t.info.get("role") == "propose"
                 and t.turns and t.turns[-1].info.get("proposal_valid")]
        if progs:  # distinct programs (inputs ignored) per valid proposal of the batch
            for t in trajs:
                t.info.setdefault("env_stats", {})["proposal_diversity"] = len(set(progs)) / len(progs)
        with self.buffer.lock:
            self.buffer.fresh.clear()

    def state_dict(self) -> dict[str, Any]:
        """The env state a checkpoint keeps: the task buffer (`agentrl.env.base.env_state`)."""
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`'s buffer (on resume)."""
        self.buffer.load_state_dict(state["buffer"])

    def eval_tasks(self) -> list[dict[str, Any]]:
        """Evaluation episodes: deduce on each pair of each held-out task (held-out split), or
        on the seed tasks (train split)."""
        n = len(HELDOUT_TASKS) if self.split == "heldout" else len(self.buffer.tasks)
        return [{"options": {"role": "solve", "mode": "deduce", "eval_task": i, "pair": p}}
                for i in range(n) for p in range(2)]

    # -- gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode. The role comes from `seed` (`role_of`), or `self.np_random` without
        one; `options` may set `role`, `mode`, `slot` (the collector's), `eval_task` + `pair`
        (evaluation) or `task` (a `Task` dict to solve).

        Returns:
            ([system, user] messages, info with `task_id`, `role`, `mode`, `group_key`,
            `task_key` (solve), `env_stats` {`buffer_size`}).

        Raises:
            ValueError: bad options.
        """
        super().reset(seed=seed)
        o = options or {}
        rng = self.np_random
        role = o.get("role") or (role_of(seed, self.propose_fraction) if seed is not None else
                                 ("propose" if rng.random() < self.propose_fraction else "solve"))
        if self.split == "heldout" and "role" not in o:
            role = "solve"
        if role not in ROLES:
            raise ValueError(f"options['role']: unknown {role!r}; allowed: {', '.join(ROLES)}")
        self.role, self._done, self._reference = role, False, None
        if role == "propose":
            self.mode, self.task = None, None
            with self.buffer.lock:
                pool = list(self.buffer.tasks)
            k = min(self.num_examples, len(pool))
            shown = [pool[i] for i in sorted(rng.choice(len(pool), size=k, replace=False))] if k else []
            text = ("Write a new small deterministic Python function `f(x)` and test inputs: a "
                    "```python block defining f, then one to six lines `Input: <Python literal>`. "
                    "Use plain data (numbers, strings, lists, tuples, dicts); no printing, files or "
                    "randomness. Aim for a task that is neither trivial nor impossible to predict.")
            if shown:
                text += "\n\nExamples:\n\n" + "\n\n".join(show_task(t) for t in shown)
            self._reference = self._reference_proposal(shown, seed)
            return self._obs(text), self._info("propose")
        self.task = self._solve_task(o, rng)
        mode = o.get("mode") or self.modes[int(rng.integers(len(self.modes)))]
        if mode not in MODES:
            raise ValueError(f"options['mode']: unknown {mode!r}; allowed: {', '.join(MODES)}")
        if mode == "induce" and len(self.task.inputs) < 2:
            mode = "deduce"  # nothing to hold out
        self.mode = mode
        n = len(self.task.inputs)
        self.pair = int(o["pair"]) % n if "pair" in o else int(rng.integers(n))
        t, i = self.task, self.pair
        if mode == "deduce":
            text = (f"What does f return for this input?\n```python\n{t.src}\n```\nInput: {t.inputs[i]}\n"
                    "Answer with one line `Output: <Python literal>`.")
        elif mode == "abduce":
            text = (f"Give an input for which f returns this output.\n```python\n{t.src}\n```\n"
                    f"Output: {t.outputs[i]}\nAnswer with one line `Input: <Python literal>`.")
        else:
            seen = (n + 1) // 2
            desc = docstring(t.src)
            pairs = "\n".join(f"Input: {a}\nOutput: {b}" for a, b in zip(t.inputs[:seen], t.outputs[:seen]))
            text = ("Write `def f(x)` in a ```python block that maps each input to its output"
                    + (f" ({desc})" if desc else "") + f".\n{pairs}")
        self._reference = (f"Output: {t.outputs[i]}" if mode == "deduce" else f"Input: {t.inputs[i]}"
                           if mode == "abduce" else f"```python\n{t.src}\n```")
        return self._obs(text), self._info(f"solve/{mode}")

    def reference_answer(self) -> str | None:
        """The answer the sandbox accepts for the current episode, for the supervised warm start
        (`agentrl.sft`, read right after `reset`): deduce `Output: <the stored output>`, abduce
        `Input: <the shown pair's input>`, induce the task's program in a ```python block; for a
        proposal, a seed task not among the prompt's examples with its inputs rotated (so its key
        is new to the buffer), or None when every such rotation is already buffered."""
        return self._reference

    def _reference_proposal(self, shown: list[Task], seed: int | None) -> str | None:
        """A valid proposal made from `SEED_TASKS`: the seed tasks whose program is not shown,
        each with its inputs rotated by 1..n-1 places, those whose key is not in the buffer; one
        of them drawn by `default_rng([seed, 2])` (independent of the episode's own draws)."""
        shown_src = {normalise(t.src) for t in shown}
        with self.buffer.lock:
            keys = set(self.buffer.keys)
        cands = [(t.src, t.inputs[r:] + t.inputs[:r]) for t in SEED_TASKS
                 if normalise(t.src) not in shown_src for r in range(1, len(t.inputs))]
        cands = [(src, ins) for src, ins in cands if task_key(src, list(ins)) not in keys]
        if not cands:
            return None
        src, ins = cands[int(np.random.default_rng([int(seed or 0), 2]).integers(len(cands)))]
        return f"```python\n{src}\n```\n" + "\n".join(f"Input: {v}" for v in ins)

    def step(self, action: str):
        """Grade the one answer. Returns ([], reward, True, False, info) with `role`, `mode`,
        `success`, `error` (why it failed), and for proposals `proposal_valid`,
        `invalid_reason` (`invalid`, `nondeterministic`, `trivial`, `duplicate`) and
        `task_key`.

        Raises:
            RuntimeError: `step` before `reset`.
        """
        if self.role is None:
            raise RuntimeError("SelfProposeEnv: call reset() before step()")
        info: dict[str, Any] = {"role": self.role, "mode": self.mode}
        if self._done:
            return [], 0.0, True, False, {**info, "success": False, "error": "the episode has ended"}
        self._done = True
        if not isinstance(action, str):
            action = ""
            info["error"] = "action must be a str"
        if self.role == "propose":
            reward = self._propose(action, info)
        else:
            reward = self._solve(action, info)
        return [], reward, True, False, info

    # -- roles -----------------------------------------------------------------------------------
    def _propose(self, action: str, info: dict[str, Any]) -> float:
        def reject(kind: str, why: str) -> float:
            info.update({"proposal_valid": False, "success": False, "invalid_reason": kind, "error": why})
            return self.invalid_reward

        try:
            src, inputs = parse_proposal(action, self.allowed)
        except ParseError as e:
            return reject("invalid", str(e))
        outs, err = self._outputs(src, inputs)
        if outs is None:
            return reject("invalid", err)
        if any(o.startswith("!") for o in outs):
            return reject("invalid", f"f raised {next(o for o in outs if o.startswith('!'))[1:]}")
        if self._outputs(src, inputs)[0] != outs:  # a second run, in a fresh child
            return reject("nondeterministic", "two runs gave different outputs")
        why = trivial_reason(src, inputs, outs)
        if why:
            return reject("trivial", why)
        task = Task(src, tuple(inputs), tuple(outs), origin="proposed")
        if not self.buffer.add(task):
            return reject("duplicate", "this program and inputs are already in the buffer")
        info.update({"proposal_valid": True, "success": True, "task_key": task.key,
                     "program_key": hashlib.sha256(normalise(src).encode()).hexdigest()[:16],
                     "program": src,
                     "error": None, "buffer_size": len(self.buffer.tasks)})
        return 0.0

    def _solve(self, action: str, info: dict[str, Any]) -> float:
        t, i = self.task, self.pair
        assert t is not None
        info["task_key"] = t.key
        try:
            if self.mode == "deduce":
                ok = parse_labelled_value(action, "output") == t.outputs[i]
            elif self.mode == "abduce":
                guess = parse_labelled_value(action, "input")
                outs, err = self._outputs(t.src, [guess])
                if outs is None:
                    raise ParseError(err)
                ok = outs[0] == t.outputs[i]
            else:
                seen = (len(t.inputs) + 1) // 2
                outs, err = self._outputs(parse_program(action, self.allowed), list(t.inputs[seen:]))
                if outs is None:
                    raise ParseError(err)
                ok = outs == list(t.outputs[seen:])
        except ParseError as e:
            info.update({"success": False, "error": str(e)})
            return 0.0
        info.update({"success": ok, "error": None if ok else "wrong answer"})
        return 1.0 if ok else 0.0

    def _outputs(self, src: str, inputs: list[str]) -> tuple[list[str] | None, str]:
        """Run `f` on `inputs` in the sandbox: (canonical outputs or `!Error`, "") or (None,
        why)."""
        try:
            pool = self._pool or default_pool(self.backend)
            res = pool.run_code(harness(src, inputs), limits=self.limits)
        except Exception as e:  # noqa: BLE001 - contract 7: a failing sandbox is a recorded step
            return None, f"sandbox error: {type(e).__name__}: {e}"[:300]
        if res.verdict != "pass":
            return None, f"the program failed in the sandbox: {res.verdict} {res.error or ''}".strip()[:300]
        outs = read_outputs(res.stdout, len(inputs))
        return (outs, "") if outs is not None else (None, "the program's outputs are not plain data")

    # -- helpers ---------------------------------------------------------------------------------
    def _solve_task(self, o: dict[str, Any], rng: np.random.Generator) -> Task:
        if "task" in o:
            t = o["task"]
            return t if isinstance(t, Task) else Task.from_dict(t)
        if "eval_task" in o:
            pool = HELDOUT_TASKS if self.split == "heldout" else tuple(self.buffer.tasks)
            return pool[int(o["eval_task"]) % len(pool)]
        with self.buffer.lock:
            if not self.buffer.tasks:
                raise ValueError("the task buffer is empty: nothing to solve")
            fresh = sorted(self.buffer.fresh)
            slot = o.get("slot")
            if slot is not None and int(slot) < len(fresh):
                found = self.buffer.get(fresh[int(slot)])
                if found is not None:
                    return found
            return self.buffer.tasks[int(rng.integers(len(self.buffer.tasks)))]

    def _obs(self, text: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]

    def _info(self, group_key: str) -> dict[str, Any]:
        info: dict[str, Any] = {"role": self.role, "mode": self.mode, "group_key": group_key,
                                "env_stats": {"buffer_size": float(len(self.buffer.tasks))}}
        if self.task is not None:
            info.update({"task_key": self.task.key, "task_id": f"{self.mode}:{self.task.key}:{self.pair}"})
        else:
            info["task_id"] = "propose"
        return info

