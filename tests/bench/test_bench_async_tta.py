"""Tests of the time-to-accuracy pieces of benchmarks/async_vs_sync.py (`async_tta`,
`policy_snapshots`): the policy of every step of a real async run, evaluated afterwards; the
standard error over tasks and the aggregation over seeds against hand-computed values."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from async_tta import aggregate, task_se  # noqa: E402
from async_vs_sync import time_to  # noqa: E402


def test_time_to():
    assert time_to([(0.0, 0.1), (4.0, 0.2), (8.0, 0.35)], 0.2) == 4.0
    assert time_to([(0.0, 0.1), (4.0, 0.2)], 0.3) is None


def test_fine_steps_from_the_last_coarse_value_far_below_the_target():
    from async_tta_main import fine_steps

    steps = [10, 20, 30, 40, 50, 60, 70, 80]
    # coarse every 40 and the last: 40 -> 0.50, 80 -> 0.70; target 0.60, margin 0.05: 40 is far
    # below, so the fine steps are 50-70
    assert fine_steps(steps, {40: 0.5, 80: 0.7}, 0.6, 0.05) == [50, 60, 70]
    # 40 within the margin (0.58 > 0.55): steps 10-30 could reach the target by noise too
    assert fine_steps(steps, {40: 0.58, 80: 0.7}, 0.6, 0.05) == [10, 20, 30, 50, 60, 70]
    # the first coarse point reaches it: the steps from 0 (before RL) to it
    assert fine_steps(steps, {40: 0.65, 80: 0.7}, 0.6, 0.05) == [10, 20, 30]
    # reached exactly at the last (ties count)
    assert fine_steps(steps, {40: 0.5, 80: 0.6}, 0.6, 0.05) == [50, 60, 70]
    # never reached: the steps after the last coarse value far below it, to the end
    assert fine_steps(steps, {40: 0.5, 80: 0.56}, 0.6, 0.05) == [50, 60, 70]
    assert fine_steps(steps, {40: 0.5, 80: 0.5}, 0.6, 0.05) == []


def test_snapshots_are_the_policy_of_every_step_of_an_async_run(tmp_path, tiny_model_dir):
    """A 3-step async run (2 batches in flight, partial rollouts) under `keep_snapshots`: one
    snapshot per step, at increasing training seconds; the last one evaluated afterwards with
    `agentrl eval` answers as the run's own evaluation after RL, word for word, and an earlier one
    does not (its weights differ)."""
    from policy_snapshots import answers, eval_policies, keep_snapshots, write_snapshots
    from rich.console import Console

    from agentrl.config import load_config
    from agentrl.train import train

    out = tmp_path / "run"
    cfg_args = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2", "train.eval_tasks=4",
                "train.eval_samples=1", "rollout.max_tokens=16", "env.kwargs={words: [x, the, def, return]}",
                "train.steps=3", "rollout.mode=async", "train.max_staleness=2", "rollout.batches_in_flight=2",
                "rollout.partial=true", "train.lr=0.05", f"model.path={tiny_model_dir}", "quiet=true"]
    cfg = load_config(None, [*cfg_args, f"out={out}"])
    with keep_snapshots() as snaps:
        summary = train(cfg, console=Console(file=io.StringIO()))
    assert [s.step for s in snaps.items] == [1, 2, 3]
    with keep_snapshots(every=2, last=3) as sparse:  # every 2nd step and the last
        train(load_config(None, [*cfg_args, f"out={tmp_path / 'run2'}"]), console=Console(file=io.StringIO()))
    assert [s.step for s in sparse.items] == [2, 3]
    ts = [s.t for s in snaps.items]
    assert 0 < ts[0] < ts[1] < ts[2]
    first = snaps.items[0].state
    assert any(not torch.equal(first[k], v) for k, v in snaps.items[-1].state.items())
    paths = write_snapshots(snaps, Path(tiny_model_dir), tmp_path / "snaps")
    assert [p.name for p in paths] == ["step_1", "step_2", "step_3"]
    evals = eval_policies(paths, out / "config.json", tmp_path / "evals", tasks=4, env_threads=2)
    assert evals[-1]["overall"]["pass@1"] == summary["eval_after"]["pass@1"]
    assert len(evals[-1]["tasks"]) == 4

    after = answers(out / "eval" / "after")
    assert len(after) == 4
    assert answers(tmp_path / "evals" / "step_3") == after  # the same sampled text, token for token
    assert answers(tmp_path / "evals" / "step_1") != after


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


def test_main_job_arguments_refused_before_any_run():
    from async_tta_main import args_error

    assert args_error(["sync", "async-2", "async-2p"], 40, 10) is None
    assert "start with sync" in args_error(["async-2", "sync"], 40, 10)
    # an unknown mode was a KeyError once sync had trained (hours on the main job)
    assert "unknown async2" in args_error(["sync", "async2"], 40, 10)
    # coarse 3, fine 2: the coarse points were silently every 6 steps
    assert "multiple of --fine" in args_error(["sync"], 3, 2)
    assert "names a mode twice" in args_error(["sync", "async-2", "async-2"], 40, 10)


def test_reuse_refuses_a_run_or_evaluation_of_other_settings(tmp_path):
    import argparse
    import json

    from async_tta_main import check_eval, check_settings

    from agentrl.config import load_config

    out = tmp_path / "s0_sync"
    (out / "eval" / "after").mkdir(parents=True)
    cfg = load_config(None, ["train.steps=3", "train.eval_tasks=8", "train.eval_samples=1"])
    (out / "config.json").write_text(cfg.model_dump_json())
    a = argparse.Namespace(eval_tasks=8, eval_samples=1)
    check_settings(out, 3, a)
    # --eval-tasks 4 on a run trained with 8: its target and evaluations were read as if on 4 tasks
    with pytest.raises(SystemExit, match=r"train.eval_tasks=8 \(this call: 4\)"):
        check_settings(out, 3, argparse.Namespace(eval_tasks=4, eval_samples=1))
    with pytest.raises(SystemExit, match=r"train.steps=3 \(this call: 5\)"):
        check_settings(out, 5, a)

    def summary(path: Path, tasks: int, samples: int) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / "summary.json").write_text(json.dumps({"meta": {"samples": samples},
                                                       "overall": {"tasks": tasks, "pass@1": 0.5}}))
        return path / "summary.json"

    summary(out / "eval" / "after", 8, 1)
    assert check_eval(summary(out / "evals" / "step_2", 8, 1), out)["overall"]["tasks"] == 8
    # an evaluation left by an earlier call on 4 tasks was mixed into an 8-task curve
    with pytest.raises(SystemExit, match="evaluated 4 tasks x 1 samples"):
        check_eval(summary(out / "evals" / "step_1", 4, 1), out)


def test_reused_runs_keep_the_record_of_the_call_that_trained_them():
    from async_tta_main import trained_by

    t0 = {"commit": "88e7ead", "command": "first", "load_average": {"start": [0.6]}}
    old = {"commit": "ff1c1c3", "command": "reuse", "training": t0,  # a record before per-run "trained"
           "seeds": {"0": {"modes": {"sync": {}, "async-2": {}}}}}
    assert trained_by(old, 0, "sync") == t0 and trained_by(old, 0, "async-2") == t0
    assert trained_by(old, 1, "sync") is None and trained_by(old, 0, "async-2p") is None
    assert trained_by(None, 0, "sync") is None
    # written by a call that trained runs itself: its own commit, not a later --reuse call's
    first = {"commit": "88e7ead", "dirty": False, "command": "first", "load_average": {"start": [0.6]},
             "seeds": {"0": {"modes": {"sync": {}}}}}
    assert trained_by(first, 0, "sync") == {k: first[k] for k in ("commit", "dirty", "command", "load_average")}
    t1 = {"commit": "abc1234", "command": "second"}
    per_run = {"commit": "later", "seeds": {"0": {"modes": {"sync": {"trained": t0}}},
                                            "1": {"modes": {"sync": {"trained": t1}}}}}
    assert trained_by(per_run, 0, "sync") == t0 and trained_by(per_run, 1, "sync") == t1


def test_speed_check_reads_steps_two_to_n(tmp_path):
    """`step_seconds`: `perf/step_s` of steps 2..N (step 1 holds the start-up), rows without it
    (evaluations) skipped."""
    from async_tta_main import step_seconds

    rows = [{"step": 1, "perf/step_s": 9.0}, {"step": 2, "perf/step_s": 0.5}, {"step": 2, "eval/pass@1": 0.3},
            {"step": 3, "perf/step_s": 0.7}, {"step": 4, "perf/step_s": 0.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert step_seconds(tmp_path, 3) == [0.5, 0.7]
