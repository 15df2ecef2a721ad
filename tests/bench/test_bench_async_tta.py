"""Tests of the time-to-accuracy pieces of benchmarks/async_vs_sync.py (`async_tta`): the curves
per second and per sample, the standard error over tasks, the aggregation over seeds, against
hand-computed values."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from async_tta import aggregate, eval_curve, task_se  # noqa: E402
from async_vs_sync import time_to  # noqa: E402

# metrics.jsonl of a 4-step run evaluated every 2 steps: step 0 (before RL), steps 1-4, the final row
ROWS = [{"step": 0, "eval/reward_mean": 0.1, "eval/seconds": 3.0},
        {"step": 1, "perf/loop_s": 2.0},
        {"step": 2, "perf/loop_s": 4.0, "eval/reward_mean": 0.2, "eval/seconds": 5.0},
        {"step": 3, "perf/loop_s": 11.0},
        {"step": 4, "perf/loop_s": 13.0},
        {"step": 4, "eval/reward_mean": 0.35}]


def test_curves_in_seconds_and_in_samples():
    # seconds: the step-2 evaluation's 5 s are taken out of the later times (11 - 5, 13 - 5)
    assert eval_curve(ROWS, {"reward_mean": 0.35}, "reward_mean") == [(0.0, 0.1), (4.0, 0.2), (8.0, 0.35)]
    assert eval_curve(ROWS, {"reward_mean": 0.35}, "reward_mean", 16) == [(0, 0.1), (32, 0.2), (64, 0.35)]
    assert time_to([(0.0, 0.1), (4.0, 0.2), (8.0, 0.35)], 0.2) == 4.0
    assert time_to([(0.0, 0.1), (4.0, 0.2)], 0.3) is None


def test_task_se():
    # per-task values 0.1, 0.2, 0.3: std(ddof=1) = 0.1, / sqrt(3)
    tasks = [{"reward_mean": 0.1}, {"reward_mean": 0.2}, {"reward_mean": 0.3}, {"reward_mean": None}]
    assert task_se(tasks) == pytest.approx(0.1 / math.sqrt(3))
    assert task_se([{"reward_mean": 0.5}]) is None
    assert task_se([{"pass@1": 1.0}, {"pass@1": 0.0}], "pass@1") == pytest.approx(math.sqrt(0.5) / math.sqrt(2))


def test_aggregate_over_seeds():
    def r(ratio, final, se):
        return {"ratio": ratio, "final": final, "final_se": se}

    per_seed = {"0": {"sync": r(1.0, 0.30, 0.03), "a": r(0.5, 0.32, 0.04)},
                "1": {"sync": r(1.0, 0.40, 0.03), "a": r(0.7, 0.36, 0.04)},
                "2": {"sync": r(1.0, 0.50, 0.03), "a": r(None, 0.47, None)}}
    out = aggregate(per_seed, ["sync", "a"])
    assert out["sync"] == {"ratios": [1.0, 1.0, 1.0], "median_ratio": 1.0, "range": [1.0, 1.0],
                           "no_ratio": 0, "final_mean": pytest.approx(0.4), "final_delta_mean": 0.0,
                           "final_delta_se": pytest.approx(math.hypot(0.03, 0.03))}
    a = out["a"]
    assert a["ratios"] == [0.5, 0.7, None] and a["no_ratio"] == 1
    assert a["median_ratio"] == pytest.approx(0.6) and a["range"] == [0.5, 0.7]  # mean of the middle two
    assert a["final_mean"] == pytest.approx(1.15 / 3)
    assert a["final_delta_mean"] == pytest.approx((0.02 - 0.04 - 0.03) / 3)
    assert a["final_delta_se"] is None  # seed 2 has no standard error
    three = aggregate({k: v for k, v in per_seed.items() if k != "2"} | {"2": {"sync": r(1.0, 0.5, 0.03),
                                                                              "a": r(0.9, 0.5, 0.04)}}, ["a"])
    assert three["a"]["median_ratio"] == 0.7 and three["a"]["range"] == [0.5, 0.9]
    assert three["a"]["final_delta_se"] == pytest.approx(0.05)  # hypot(0.04, 0.03), the same on every seed
    at = {k: {m: {"ratio": 1.0, "at_sync_steps": x, "at_sync_steps_se": 0.01} for m, x in (("sync", v), ("a", v + d))}
          for k, v, d in (("0", 0.3, 0.01), ("1", 0.4, -0.03))}
    b = aggregate(at, ["a"], key="at_sync_steps")["a"]
    assert b["final_mean"] == pytest.approx(0.34) and b["final_delta_mean"] == pytest.approx(-0.01)
    assert b["final_delta_se"] == pytest.approx(math.sqrt(2) * 0.01)
