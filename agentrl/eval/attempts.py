"""Metrics of multi-turn repair: did the first attempt pass, and was a failed first attempt
fixed by a later one (code_sandbox with `max_turns` > 1: the env's feedback, the agent tries
again). Pure functions of episode rows (`agentrl.eval.harness.episode_row`) or trajectories;
no torch.

Definitions, per episode (an attempt is an agent turn; its verdict is the env's
`info["verdict"]`, else `info["success"]`):
- first-attempt success: the first turn's verdict is `pass`;
- a *first-attempt failure* is an episode whose first attempt failed; it is *repaired* when
  the episode still succeeds (`success`, a later attempt passed). An episode without an
  attempt (its reset failed: 0 turns) is no first-attempt failure: it fails pass@1 and
  first-attempt pass@1 as every unsolved episode, but there was no attempt to repair.

Over an evaluation (`attempt_metrics`), with tasks i = 1..m, n_i episodes each:
- `first_attempt_pass@1`: mean over tasks of (first-attempt successes_i / n_i), and
  `first_attempt_pass@1_se` = std(ddof=1) / sqrt(m) over tasks, as pass@1 (`agentrl.eval.report`);
  the existing `pass@1` is then pass within `max_attempts` attempts;
- `repair_rate` = sum_i y_i / sum_i x_i with x_i the first-attempt failures and y_i the repaired
  episodes of task i (the share of failed first attempts fixed later, pooled over episodes),
  and `repair_rate_se` its standard error over tasks as a ratio estimator (Cochran, Sampling
  Techniques, 3rd ed. 1977, eq. 6.13, without the finite-population factor):
  `sqrt(sum_i (y_i - R x_i)^2 / (m (m - 1))) / mean_i(x_i)` (tasks without a failure count in
  m and in mean(x) with x_i = y_i = 0); None when fewer than two tasks have a first-attempt
  failure (with one, R = y_k / x_k and every residual is 0: an SE of 0 that measures nothing);
- `attempts_mean`: attempts per episode; `first_attempt_failures`, `repaired`: the totals.

Against independent attempts (`independent_metrics`, with k = the allowed attempts, `max_turns`):
does the feedback help, or would k fresh attempts at the task do as well? The comparison at
equal attempts of Olausson et al., "Is Self-Repair a Silver Bullet for Code Generation?"
(ICLR 2024, arXiv:2306.09896), from the same episodes: task i's n_i first attempts are n_i
independent samples of a first attempt (c_i of them pass), so
- `independent_pass` = mean over tasks of pass@k(n_i, c_i) (`agentrl.eval.metrics.pass_at_k`,
  Chen et al. 2021's unbiased estimator): pass within k attempts made *without* feedback
  (`independent_k` = k); `_se` over tasks;
- `feedback_gain` = mean over tasks of (pass within k attempts_i - pass@k(n_i, c_i)), `_se` the
  standard error of that paired difference over tasks: > 0 when the feedback turns did better
  than fresh attempts;
- `independent_repair_rate` = sum_i x_i q_i / sum_i x_i with q_i = pass@(k-1)(n_i - 1, c_i): the
  share of failed first attempts that k - 1 fresh attempts (drawn from the task's other
  first attempts) would have fixed, to set beside `repair_rate`;
- `independent_excluded`: tasks with fewer episodes than k (no estimate; left out of all three).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentrl.eval.metrics import mean_se, pass_at_k
from agentrl.types import Trajectory


def first_attempt_passed(verdicts: Sequence[Any], rewards: Sequence[Any] = ()) -> bool:
    """Did the first attempt pass? Its verdict is `pass`; without a verdict, its reward >= 1."""
    if verdicts and verdicts[0] is not None:
        return verdicts[0] == "pass"
    return bool(rewards) and rewards[0] is not None and float(rewards[0]) >= 1.0


def ratio_se(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Standard error over clusters of R = sum(y) / sum(x) (module doc), None when fewer than
    two clusters have x > 0 (none: no ratio; one: every residual is 0)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    m = xa.size
    if int((xa > 0).sum()) < 2:
        return None
    r = ya.sum() / xa.sum()
    return float(math.sqrt(((ya - r * xa) ** 2).sum() / (m * (m - 1))) / xa.mean())


def _outcomes_by_task(rows: Sequence[dict[str, Any]]) -> dict[int, list[tuple[bool, bool, bool]]]:
    """Per `task_index`, each episode's (first attempt passed, made an attempt, succeeded)."""
    by_task: dict[int, list[tuple[bool, bool, bool]]] = {}
    for r in rows:
        first = first_attempt_passed(r.get("turn_verdicts") or [], r.get("turn_rewards") or [])
        tried = int(r.get("turns") or 0) > 0
        by_task.setdefault(int(r["task_index"]), []).append((first, tried, bool(r["success"])))
    return by_task


def attempt_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The repair metrics of evaluation rows (module doc). Each row needs `task_index`,
    `success`, `turns`, `turn_verdicts` and `turn_rewards`.

    Returns:
        `first_attempt_pass@1`, `first_attempt_pass@1_se`, `repair_rate`, `repair_rate_se`,
        `attempts_mean`, `first_attempt_failures`, `repaired` (None where undefined).
    """
    by_task = _outcomes_by_task(rows)
    first_rate = np.array([np.mean([f for f, _, _ in g]) for g in by_task.values()], dtype=float)
    x = [sum(t and not f for f, t, _ in g) for g in by_task.values()]
    y = [sum(t and not f and s for f, t, s in g) for g in by_task.values()]
    first, first_se = mean_se(first_rate)
    return {
        "first_attempt_pass@1": first,
        "first_attempt_pass@1_se": first_se,
        "repair_rate": float(sum(y) / sum(x)) if sum(x) else None,
        "repair_rate_se": ratio_se(x, y),
        "attempts_mean": float(np.mean([r["turns"] for r in rows])) if rows else None,
        "first_attempt_failures": int(sum(x)),
        "repaired": int(sum(y)),
    }


def independent_metrics(rows: Sequence[dict[str, Any]], k: int) -> dict[str, Any]:
    """Pass within `k` attempts with feedback against `k` independent first attempts (module
    doc): `independent_k` (= k), `independent_pass`, `independent_pass_se`, `feedback_gain`,
    `feedback_gain_se`, `independent_repair_rate`, `independent_excluded`. Rows as `attempt_metrics`'s; an episode
    without an attempt counts as a failed first attempt in c_i's n_i (as in
    `first_attempt_pass@1`) and is no failure to repair (as in `repair_rate`). Values are None
    where undefined (no task with k episodes; an SE from one task; no failed first attempt).

    Raises:
        ValueError: `k` < 2 (one attempt has nothing to compare).
    """
    if k < 2:
        raise ValueError(f"independent_metrics: k must be >= 2 (the allowed attempts), got {k}")
    by_task = _outcomes_by_task(rows)
    indep, gain, x, xq = [], [], 0, 0.0
    for g in by_task.values():
        n, c = len(g), sum(f for f, _, _ in g)
        if n < k:
            continue
        p = pass_at_k(n, c, k)
        indep.append(p)
        gain.append(sum(s for _, _, s in g) / n - p)
        fails = sum(t and not f for f, t, _ in g)
        x += fails
        xq += fails * pass_at_k(n - 1, c, k - 1) if fails else 0.0

    (ip, ip_se), (fg, fg_se) = mean_se(indep), mean_se(gain)
    return {"independent_k": k, "independent_pass": ip, "independent_pass_se": ip_se, "feedback_gain": fg,
            "feedback_gain_se": fg_se, "independent_repair_rate": xq / x if x else None,
            "independent_excluded": len(by_task) - len(indep)}


def has_attempts(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether the env grades its turns as attempts: some turn carries a verdict
    (`info["verdict"]`, e.g. code_sandbox's `pass`/`fail`). A tool env's turns (web_qa's
    searches, then one answer) are steps of one attempt, not attempts."""
    return any(v is not None for r in rows for v in r.get("turn_verdicts") or [])


def is_multi_attempt(rows: Sequence[dict[str, Any]], max_attempts: int | None = None) -> bool:
    """Whether an evaluation is multi-attempt, so its summary carries the repair metrics: the
    env grades attempts (`has_attempts`) and allowed more than one (`max_attempts`, from the
    run's `env.max_turns`) or an episode took more than one."""
    return has_attempts(rows) and ((max_attempts or 1) > 1 or any(int(r.get("turns") or 0) > 1 for r in rows))


def step_attempt_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Per-step training metrics of a multi-turn batch ({} when every episode took one turn):
    `rollout/reward_turn_<t>` (mean reward of turn t, 1-based, over the episodes that reached
    it), `rollout/first_attempt_pass_rate` (over every episode, as `rollout/pass_rate`),
    `rollout/repair_rate` (repaired / first-attempt failures, episodes without a turn in
    neither; NaN without a failure), and `rollout/repeat_rate` (the share of attempts after
    the first that resubmitted an earlier attempt's code: a turn's `info["repeat"]`, where the
    env reports it, as `code_sandbox` does; NaN without a later attempt). Attempts used per
    episode is `rollout/turns`. Only envs that grade their turns as attempts (a turn's
    `info["verdict"]`, `has_attempts`)."""
    if not any(len(t.turns) > 1 for t in trajs) or not any(
            tn.info.get("verdict") is not None for t in trajs for tn in t.turns):
        return {}
    m: dict[str, float] = {}
    longest = max(len(t.turns) for t in trajs)
    for i in range(longest):
        rs = [t.turns[i].reward for t in trajs if len(t.turns) > i]
        m[f"rollout/reward_turn_{i + 1}"] = float(np.mean(rs))
    fails = repaired = firsts = 0
    for t in trajs:
        if not t.turns:
            continue
        first = first_attempt_passed([t.turns[0].info.get("verdict")], [t.turns[0].reward])
        last = t.turns[-1].info
        success = bool(last.get("success", last.get("verdict") == "pass"))
        firsts += first
        fails += not first
        repaired += (not first) and success
    m["rollout/first_attempt_pass_rate"] = firsts / len(trajs)
    m["rollout/repair_rate"] = repaired / fails if fails else float("nan")
    later = [tn.info["repeat"] for t in trajs for tn in t.turns[1:] if "repeat" in tn.info]
    if later or any("repeat" in t.turns[0].info for t in trajs if t.turns):
        m["rollout/repeat_rate"] = float(np.mean(later)) if later else float("nan")
    return m
