"""The main job as a user runs it: `agentrl train` as a subprocess, in-process and with Ray
rollout workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
        "model.intermediate_size=64", "sft.steps=2", "sft.batch_size=4", "rollout.tasks_per_step=2",
        "algo.group_size=2", "train.eval_tasks=2", "train.eval_samples=1", "rollout.max_tokens=24"]


def run_cli(args, tmp_path, timeout=600):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_train_code_sandbox_two_steps_subprocess(tmp_path):
    out = tmp_path / "run"
    r = run_cli(["train", "--env", "code_sandbox", "--algo", "grpo", "--steps", "2", "--out", str(out),
                 "--quiet", *TINY], tmp_path)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in rows if "rollout/reward_mean" in x]
    assert [x["step"] for x in steps] == [1, 2]
    for x in steps:
        for key in ("rollout/reward_std", "rollout/pass_rate", "rollout/response_len", "loss/clipfrac",
                    "loss/entropy", "loss/grad_norm", "perf/rollout_s", "perf/env_s", "perf/update_s"):
            assert key in x, key
    assert (out / "checkpoints" / "step_2" / "model.safetensors").exists()
    assert (out / "sft_metrics.jsonl").read_text().count("sft/loss") == 2
    summary = json.loads((out / "summary.json").read_text())
    assert "pass@1" in summary["eval_before"] and "pass@1" in summary["eval_after"]
    assert "held-out pass@1" in r.stdout


@pytest.mark.slow
def test_train_with_two_ray_workers(tmp_path):
    out = tmp_path / "ray"
    run_cli(["train", "--env", "toy", "--algo", "grpo", "--steps", "2", "--out", str(out), "--quiet",
             "rollout.num_workers=2", *TINY], tmp_path, timeout=900)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "rollout/reward_mean" in x] == [1, 2]
