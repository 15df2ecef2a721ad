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


def _curve(pts, grid="coarse"):
    return [{"wall_s": w, "samples": s, "pass@1": p, "pass@1_se": 0.01, "grid": grid} for w, s, p in pts]


def test_verdict_met_and_not_met():
    trl = _curve([(0, 0, 0.2), (100, 1000, 0.25), (200, 2000, 0.30), (300, 3000, 0.28)])
    fast = _curve([(0, 0, 0.2), (60, 1500, 0.27), (70, 1750, 0.31), (300, 7500, 0.35)])
    v = lvt.verdict({"trl": trl, "ours": fast})
    assert v["trl_best_pass@1"] == 0.30 and v["trl_best_wall_s"] == 200 and v["trl_reach_wall_s"] == 200
    assert v["ours_reach_wall_s"] == 70 and v["time_ratio"] == pytest.approx(0.35) and v["time_met"]
    # matched at TRL's 1000, 2000, 3000 samples: ours 0.2 + 0.07 * 1000/1500, then interpolated
    m = {p["samples"]: p["ours"] for p in v["per_sample"]}
    assert m[1000] == pytest.approx(0.2 + 0.07 * 1000 / 1500)
    assert m[2000] == pytest.approx(0.31 + 0.04 * 250 / 5750)
    assert v["per_sample_met"] and v["met"]
    # 0.45x: above the target of 0.4
    v = lvt.verdict({"trl": trl, "ours": _curve([(0, 0, 0.2), (90, 2250, 0.31), (300, 7500, 0.35)])})
    assert v["time_ratio"] == pytest.approx(0.45) and not v["time_met"] and v["met"] is False
    slow = _curve([(0, 0, 0.2), (150, 3000, 0.22), (300, 6000, 0.31)])
    v = lvt.verdict({"trl": trl, "ours": slow})
    assert v["time_ratio"] == pytest.approx(1.5) and not v["time_met"]
    assert v["per_sample_mean_diff"] < 0 and not v["per_sample_met"] and v["met"] is False
    flat = _curve([(0, 0, 0.2), (100, 1000, 0.19)])
    v = lvt.verdict({"trl": flat, "ours": fast})
    assert v["time_met"] is None and v["met"] is None and "undefined" in v["time_note"]
    assert "MET" in lvt.verdict_text(lvt.verdict({"trl": trl, "ours": fast}))
    zero = [{**p, "pass@1": 0.0, "pass@1_se": 0.0} for p in trl]  # nothing passes on either side
    v = lvt.verdict({"trl": zero, "ours": zero})
    assert v["per_sample_mean_diff"] == 0 and v["per_sample_met"] and v["time_met"] is None


def test_verdict_times_both_sides_on_the_fine_grid():
    """TRL's best comes from its coarse points only; each side's time is its first point on
    either grid at or above it; the per-sample comparison uses coarse points only."""
    trl = _curve([(0, 0, 0.2), (180, 1800, 0.28), (210, 2100, 0.30)])
    trl += _curve([(190, 1900, 0.305), (200, 2000, 0.29)], "fine")  # 0.305 is fine: not TRL's best
    trl.sort(key=lambda p: p["wall_s"])
    ours = _curve([(0, 0, 0.2), (60, 1200, 0.25), (90, 1800, 0.33)]) + _curve([(70, 1400, 0.29), (80, 1600, 0.30)], "fine")
    ours.sort(key=lambda p: p["wall_s"])
    v = lvt.verdict({"trl": trl, "ours": ours})
    assert v["trl_best_pass@1"] == 0.30 and v["trl_best_wall_s"] == 210
    assert v["trl_reach_wall_s"] == 190 and v["ours_reach_wall_s"] == 80
    assert v["time_ratio"] == pytest.approx(80 / 190)
    assert [p["samples"] for p in v["per_sample"]] == [1800]  # TRL's 2100 is beyond ours' coarse 1800
    assert v["per_sample"][0]["ours"] == pytest.approx(0.33)


def test_coarse_indices_are_what_a_coarse_clock_saves():
    walls = [10.4, 20.1, 31.0, 40.2, 50.0, 59.9, 62.5, 70.1, 95.0, 100.0]
    cks = [{"wall_s": w} for w in walls]
    # every 30 s: first at/after 30 (31.0), 60 (62.5), 90 (95.0, which also passes 120? no), and the last
    assert lvt.coarse_indices(cks, 30) == [2, 6, 8, 9]
    # a Clock(every_s=30) fed the same step ends saves at the same ones
    c, saved = Clock(budget_s=100, every_s=30), []
    for i, w in enumerate(walls):
        save, _ = c.due(w)
        if save:
            c.saved(w, 0.0)
            saved.append(i)
    assert saved == [2, 6, 8, 9]
    assert lvt.coarse_indices([{"wall_s": 5.0}], 30) == [0] and lvt.coarse_indices([], 30) == []


def test_first_reach_refines_only_the_bracket():
    values = {-1: 0.2, 0: 0.21, 1: 0.22, 2: 0.25, 3: 0.31, 4: 0.29, 5: 0.33, 6: 0.35, 7: 0.3, 8: 0.36}
    co = [2, 5, 8]
    asked = []

    def get(i):
        asked.append(i)
        return {"pass@1": values[i]}

    # coarse 2 (0.25) < 0.3, coarse 5 (0.33) reaches: the fine ones 3, 4 are asked in order, 3 reaches
    assert lvt.first_reach(co, 0.30, get) == 3 and asked == [2, 5, 3]
    asked.clear()
    assert lvt.first_reach(co, 0.24, get) == 2 and asked == [2, 0, 1]  # back to the warm start's bracket
    asked.clear()
    assert lvt.first_reach(co, 0.5, get) is None and asked == [2, 5, 8]


def test_summary_median_and_range():
    def v(ratio, met, diff):
        return {"time_ratio": ratio, "time_met": met, "per_sample_mean_diff": diff, "per_sample_met": diff > -0.02}

    s = lvt.summary([v(0.35, True, 0.01), v(0.45, False, 0.0), v(0.38, True, -0.01)])
    assert s["time_ratio_median"] == pytest.approx(0.38) and (s["time_ratio_min"], s["time_ratio_max"]) == (0.35, 0.45)
    assert s["time_met"] and s["per_sample_all_met"] and s["met"]
    s = lvt.summary([v(0.35, True, 0.01), v(None, False, 0.0), v(0.45, False, -0.05)])  # never reached: +inf
    assert s["time_ratio_median"] == pytest.approx(0.45) and s["time_ratio_max"] == float("inf")
    assert s["time_met"] is False and s["per_sample_all_met"] is False and s["met"] is False
    assert "median 0.450x" in lvt.summary_text(s)


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
           "--budget-s", "40", "--every-s", "20", "--fine-s", "10", "--repeats", "2", "--eval-tasks", "16",
           "--eval-samples", "2", "--json", str(out / "r.json"), "--md", str(out / "r.md"), "--png",
           str(out / "r.png"), "--warm-args", "sft.steps=20", "sft.stop_pass_rate=null", "train.eval_tasks=4",
           "train.eval_samples=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=2400, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "r.json").read_text())
    assert (out / "r.png").stat().st_size > 0 and "## Verdict" in (out / "r.md").read_text()
    assert [r["order"] for r in res["repeats"]] == [["trl", "ours"], ["ours", "trl"]]
    for rep in res["repeats"]:
        c = rep["checks"]
        assert c["prompt_ids"]["checked"] > 0 and c["prompt_ids"]["different"] == 0
        assert c["rewards"]["checked"] >= 128 and c["rewards"]["different"] == 0
        for side in ("trl", "ours"):
            assert c["task_seeds"][side]["steps"] >= 1 and c["task_seeds"][side]["different"] == 0
            pts = rep["curves"][side]
            assert pts[0]["name"] == "warm start" and pts[0]["wall_s"] == 0 and len(pts) >= 2
            assert pts[-1]["wall_s"] >= 40 and all(p["tasks"] == 16 and p["episodes"] == 32 for p in pts)
            assert [p["wall_s"] for p in pts] == sorted(p["wall_s"] for p in pts)
            cks = rep["runs"][side]["checkpoints"]
            coarse = [p["wall_s"] for p in pts[1:] if p["grid"] == "coarse"]
            assert coarse == [cks[i]["wall_s"] for i in lvt.coarse_indices(cks, 20)]  # every coarse one evaluated
            assert len(cks) > len(coarse)  # saved every 10 s
        assert rep["curves"]["trl"][0]["pass@1"] == rep["curves"]["ours"][0]["pass@1"]  # one warm start
        assert set(rep["verdict"]) >= {"met", "time_met", "per_sample_met", "trl_best_pass@1", "trl_reach_wall_s"}
    assert res["summary"]["repeats"] == 2 and "Over 2 repeats" in proc.stdout


def test_step_profile_means_and_cached_share():
    steps = [{"step": 1, "wall_s": 1.0, "reward": 0.5, "generate_s": 0.2, "env_s": 0.6, "update_s": 0.3,
              "cached": 32.0, "episodes": 128},
             {"step": 2, "wall_s": 2.0, "reward": 0.5, "generate_s": 0.4, "env_s": 0.2, "update_s": 0.5,
              "cached": 96.0, "episodes": 128}]
    p = lvt.step_profile(steps)
    assert p == pytest.approx({"generate_s": 0.3, "env_s": 0.4, "update_s": 0.4, "cached_share": 0.5})
    assert lvt.profile_text(p) == ("agentrl per step: generation 0.30 s, env (sandbox) 0.40 s, update 0.40 s; "
                                   "the verdict cache answered 50% of the env steps")
    assert lvt.step_profile([{"step": 1, "wall_s": 1.0, "reward": 0.0}]) is None  # an older run's records
    assert lvt.profile_text(None) == "agentrl's step profile: not recorded"
