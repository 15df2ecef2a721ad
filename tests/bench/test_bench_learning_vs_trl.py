"""Tests of the learning comparison with TRL (benchmarks/learning_vs_trl*.py): the reward equals
the code_sandbox env's, the TRL rows are the env's prompts for agentrl's per-step seeds, the
checkpoint clock and the verdict arithmetic; and (slow) the whole script on a tiny budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import learning_vs_trl as lvt  # noqa: E402
from learning_vs_trl_common import (  # noqa: E402
    Clock,
    CodeReward,
    env_reward,
    step_seeds,
    task_rows,
)

from agentrl.config import load_config  # noqa: E402
from agentrl.run import build_env  # noqa: E402


@pytest.fixture(scope="module")
def cfg():
    return load_config()  # the main job's defaults (code_sandbox, binary reward, one attempt)


def test_rows_are_the_env_prompts_of_agentrls_step_seeds(cfg):
    rows, tasks = task_rows(cfg, 3)
    P = cfg.rollout.tasks_per_step
    assert len(rows) == 3 * P and [r["row"] for r in rows] == list(range(3 * P))
    env = build_env(cfg, "train")
    for step in range(3):
        block = rows[step * P:(step + 1) * P]
        assert [r["seed"] for r in block] == step_seeds(cfg.seed, step, P)
        assert all(r["step"] == step for r in block)
        for r in block[:4]:
            obs, _ = env.reset(seed=r["seed"])
            assert r["prompt"] == obs and [m["role"] for m in obs] == ["system", "user"]
            assert tasks[r["row"]].task_id == env.unwrapped.task.task_id


def test_reward_equals_the_env_step_reward(cfg):
    rows, tasks = task_rows(cfg, 1)
    reward, env = CodeReward(cfg), build_env(cfg, "train")
    seen = set()
    for r in rows[:6]:
        task = tasks[r["row"]]
        sol = task.solution.rstrip("\n")
        wrong = sol.replace("return", "return None and", 1)
        answers = [sol, f"Here:\n```python\n{sol}\n```", f"```python\n{sol}", wrong, "", "no code here (",
                   "def f(:\n  pass", "```py\nimport os\n```"]
        for text in answers:
            ours = reward(task, text)
            assert ours == env_reward(env, r["seed"], text), (task.task_id, text)
            seen.add(ours)
    assert seen == {0.0, 1.0}


def test_clock_schedule():
    c = Clock(budget_s=100, every_s=30)
    assert c.due(10) == (False, False)
    assert c.due(31) == (True, False)
    c.saved(31, 0.5)
    assert c.saved_s == 0.5 and c.next_save == 60
    assert c.due(59) == (False, False) and c.due(61) == (True, False)
    c.saved(95, 0.5)  # a long step skips a slot: the next save is the next multiple
    assert c.next_save == 120 and c.due(101) == (True, True)


def _curve(pts):
    return [{"wall_s": w, "samples": s, "pass@1": p, "pass@1_se": 0.01} for w, s, p in pts]


def test_verdict_met_and_not_met():
    trl = _curve([(0, 0, 0.2), (100, 1000, 0.25), (200, 2000, 0.30), (300, 3000, 0.28)])
    fast = _curve([(0, 0, 0.2), (60, 1500, 0.27), (90, 2250, 0.31), (300, 7500, 0.35)])
    v = lvt.verdict({"trl": trl, "ours": fast})
    assert v["trl_best_pass@1"] == 0.30 and v["trl_best_wall_s"] == 200
    assert v["ours_reach_wall_s"] == 90 and v["time_ratio"] == pytest.approx(0.45) and v["time_met"]
    # matched at TRL's 1000, 2000, 3000 samples: ours 0.2 + 0.07 * 1000/1500, then interpolated
    m = {p["samples"]: p["ours"] for p in v["per_sample"]}
    assert m[1000] == pytest.approx(0.2 + 0.07 * 1000 / 1500)
    assert m[2000] == pytest.approx(0.27 + 0.04 * 500 / 750)
    assert v["per_sample_met"] and v["met"]
    slow = _curve([(0, 0, 0.2), (150, 3000, 0.22), (300, 6000, 0.31)])
    v = lvt.verdict({"trl": trl, "ours": slow})
    assert v["time_ratio"] == pytest.approx(1.5) and not v["time_met"]
    assert v["per_sample_mean_diff"] < 0 and not v["per_sample_met"] and v["met"] is False
    flat = _curve([(0, 0, 0.2), (100, 1000, 0.19)])
    v = lvt.verdict({"trl": flat, "ours": fast})
    assert v["time_met"] is None and v["met"] is None and "undefined" in v["time_note"]
    assert "MET" in lvt.verdict_text(lvt.verdict({"trl": trl, "ours": fast}))


def test_trl_config_matches_the_run_config(cfg, tmp_path):
    pytest.importorskip("trl")
    from learning_vs_trl_trl import trl_config_kwargs
    from trl import GRPOConfig

    g = GRPOConfig(**trl_config_kwargs(cfg, str(tmp_path), 10))
    P, G = cfg.rollout.tasks_per_step, cfg.algo.group_size
    assert (g.per_device_train_batch_size, g.num_generations, g.generation_batch_size) == (P * G, G, P * G)
    assert g.steps_per_generation == 1 and g.num_iterations == 1 and g.beta == 0
    assert (g.epsilon, g.epsilon_high) == (cfg.algo.clip_low, cfg.algo.clip_high) == (0.2, 0.28)
    assert g.learning_rate == cfg.train.lr and g.max_completion_length == cfg.rollout.max_tokens
    assert g.loss_type == "dapo" and not g.shuffle_dataset and g.temperature == cfg.rollout.temperature


@pytest.mark.slow
def test_smoke_run_end_to_end(tmp_path):
    """The whole comparison on a tiny budget: a quick warm start (20 SFT steps), 40 s of training
    per side with a checkpoint every 20 s, evaluations of 16 held-out tasks x 2 samples."""
    pytest.importorskip("trl")
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / "learning_vs_trl.py"), "--work", str(tmp_path / "work"),
           "--budget-s", "40", "--every-s", "20", "--eval-tasks", "16", "--eval-samples", "2",
           "--json", str(out / "r.json"), "--md", str(out / "r.md"), "--png", str(out / "r.png"),
           "--warm-args", "sft.steps=20", "sft.stop_pass_rate=null", "train.eval_tasks=4",
           "train.eval_samples=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "r.json").read_text())
    assert (out / "r.png").stat().st_size > 0 and "## Verdict" in (out / "r.md").read_text()
    c = res["checks"]
    assert c["prompt_ids"]["checked"] > 0 and c["prompt_ids"]["different"] == 0
    assert c["rewards"]["checked"] >= 128 and c["rewards"]["different"] == 0
    for side in ("trl", "ours"):
        assert c["task_seeds"][side]["steps"] >= 1 and c["task_seeds"][side]["different"] == 0
        pts = res["curves"][side]
        assert pts[0]["name"] == "warm start" and pts[0]["wall_s"] == 0 and len(pts) >= 2
        assert pts[-1]["wall_s"] >= 40 and all(p["tasks"] == 16 and p["episodes"] == 32 for p in pts)
        assert [p["wall_s"] for p in pts] == sorted(p["wall_s"] for p in pts)
    assert res["curves"]["trl"][0]["pass@1"] == res["curves"]["ours"][0]["pass@1"]  # one warm start
    assert set(res["verdict"]) >= {"met", "time_met", "per_sample_met", "trl_best_pass@1"}
    assert "Target: agentrl reaches TRL's best" in proc.stdout
