"""benchmarks/repair_vs_fresh.py's second-attempt figures against hand-computed values: the
second attempt's pass rate after a failed first, one fresh attempt's (the task's other first
attempts), and the share of second attempts that repeat the first word for word."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from repair_vs_fresh import second_attempt, table  # noqa: E402


def row(task: int, attempts: list[str], verdicts: list[str]) -> dict:
    msgs = [{"role": "user", "content": "task"}]
    for a in attempts:
        msgs += [{"role": "assistant", "content": a}, {"role": "user", "content": "feedback"}]
    return {"task_index": task, "turn_verdicts": verdicts, "turn_rewards": [float(v == "pass") for v in verdicts],
            "messages": msgs[:-1]}


def test_second_attempt_by_hand():
    # task 0: 3 episodes, first attempts pass/fail/fail; task 1: 2 episodes, both fail first
    rows = [row(0, ["a"], ["pass"]),
            row(0, ["b", "b"], ["fail", "fail"]),  # a repeat; its task's others: 1 of 2 pass
            row(0, ["c", "d", "e"], ["fail", "fail", "pass"]),  # others: 1 of 2
            row(1, ["x", "y"], ["fail", "pass"]),  # others: 0 of 1
            row(1, ["z"], ["fail"])]  # no second attempt: not counted
    got = second_attempt(rows)
    assert got["second_attempts"] == 3 and got["repeats"] == 1
    assert got["second_attempt_pass"] == pytest.approx(1 / 3)
    assert got["one_fresh_attempt"] == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    figures = {"first_attempt_pass@1": 0.4, "first_attempt_pass@1_se": 0.1, "pass@1": 0.6, "pass@1_se": 0.1,
               "independent_pass": 0.7, "independent_pass_se": 0.1, "feedback_gain": -0.1,
               "feedback_gain_se": 0.05, "repair_rate": 0.25, "repair_rate_se": 0.1,
               "independent_repair_rate": 0.5, **got}
    line = table({"r": {"before": figures, "after": figures}}).splitlines()[-1]
    assert line.endswith("| 0.333 | 0.333 | 0.333 |")  # 2nd attempt, one fresh, repeats
    assert second_attempt([row(0, ["a"], ["pass"])])["repeats"] == 0
