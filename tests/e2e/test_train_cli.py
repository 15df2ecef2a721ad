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


def test_training_heldout_figure_equals_agentrl_eval(tmp_path):
    """One held-out set, one number: the run's after-RL evaluation (OUT/eval/after) and
    `agentrl eval OUT` on the final checkpoint run the same tasks (the first `eval_tasks` of the
    env's fixed held-out list) with the same settings and seeds, and sample the same episodes
    token for token; the before-RL figure is reproduced the same way from OUT/sft_model."""
    from rich.console import Console

    from agentrl.config import load_config
    from agentrl.eval.cli import eval_command
    from agentrl.eval.report import read_results
    from agentrl.train import train

    out = tmp_path / "run"
    tiny = [a for a in TINY if not a.startswith("train.eval_")]
    cfg = load_config(None, [*tiny, "train.steps=2", "train.eval_tasks=6", "train.eval_samples=2",
                             "train.eval_batch_size=4", "train.log_rollouts_every=1", f"out={out}",
                             "quiet=true"])
    summary = train(cfg)
    quiet = Console(file=open(tmp_path / "eval.log", "w"))
    for tag, model, ev in (("after", str(out), summary["eval_after"]),
                           ("before", str(out / "sft_model"), summary["eval_before"])):
        s = eval_command(model=model, config=str(out / "config.json") if tag == "before" else None,
                         out=str(tmp_path / f"eval_{tag}"), console=quiet)
        assert s["overall"]["tasks"] == 6 and s["k"] == [1, 2] and s["meta"]["temperature"] == 1.0
        assert s["meta"]["tasks_from"] == "env.tasks()"
        assert s["overall"]["pass@1"] == ev["pass@1"] and s["overall"]["pass@2"] == ev["pass@2"]
        ours = read_results(out / "eval" / tag)
        theirs = read_results(tmp_path / f"eval_{tag}")
        assert [r["messages"] for r in ours] == [r["messages"] for r in theirs]
        assert [r["task_id"] for r in ours] == [r["task_id"] for r in theirs]
    # the held-out tasks are never trained on: RL batches and warm-start examples are train-split
    from agentrl.rollout.chat import ChatRenderer
    from agentrl.run import build_env
    from agentrl.sft import sft_examples
    from agentrl_envs.code_tasks import key_split

    def split_of(task_id):  # built-in ids are gen/<key>/<function name>
        return key_split(task_id.split("/", 1)[1].rsplit("/", 1)[0])

    assert {split_of(r["task_id"]) for r in read_results(out / "eval" / "after")} == {"heldout"}
    rl = [json.loads(x)["task_id"] for f in (out / "rollouts").glob("*.jsonl") for x in f.read_text().splitlines()]
    from transformers import AutoTokenizer

    sft = [t.task_id for t in sft_examples(build_env(cfg, "train"), ChatRenderer(AutoTokenizer.from_pretrained(out / "sft_model")),
                                           2000, seed=cfg.seed * 7919 + 1)]
    assert len(rl) == 8 and len(sft) == 2000
    assert {split_of(t) for t in rl + sft} == {"train"}
