"""Each algorithm learns, end to end through `agentrl.train.train`, and each runs from the CLI.

Learning: the toy env (`envs/toy.py`: reward 1 when the answer contains the requested word)
with a tiny randomly initialised model and no supervised warm start; 60 steps of 8 tasks x 4
episodes. The mean rollout reward of the last 3 steps must exceed that of the first 3 by 0.1
(measured: 0.01-0.04 at the start, 0.15-0.72 at the end for seeds 0-2; 7-35 s per algorithm on
a loaded 2-core machine).

CLI: `agentrl train --env code_sandbox --algo X --steps 1` with small settings, as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.algos import ALGORITHMS

TOY = ["env.name=toy", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
       "model.intermediate_size=64", "model.vocab_size=300", "sft.steps=0",
       "rollout.tasks_per_step=8", "algo.group_size=4", "rollout.max_tokens=4",
       "train.eval_tasks=4", "train.eval_samples=1", "train.steps=60", "train.lr=1e-2",
       "train.log_rollouts_every=0", "train.torch_threads=1", "rollout.torch_threads=1",
       "quiet=true", "seed=0"]


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory) -> str:
    """The embedded tiny model for the toy env, built once (tokenizer from the env's texts)."""
    from agentrl.config import load_config
    from agentrl.run import default_model_dir

    return default_model_dir(load_config(None, TOY), tmp_path_factory.mktemp("toy_base"))


#: algorithms that learn from the env reward alone (distill needs a teacher: its own test below)
REWARD_ALGOS = [a for a in ALGORITHMS if a != "distill"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", REWARD_ALGOS)
def test_algorithm_raises_toy_reward(algo, toy_model, tmp_path):
    from agentrl.config import load_config
    from agentrl.train import train

    cfg = load_config(None, TOY + [f"algo.name={algo}", f"model.path={toy_model}",
                                   f"out={tmp_path / 'run'}"])
    train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    rewards = [r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r]
    assert len(rewards) == 60
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, f"{algo}: mean reward {first:.3f} -> {last:.3f}: {rewards}"
    updates = [r for r in rows if "loss/loss" in r]
    assert updates, f"{algo}: no update was made"


@pytest.mark.slow
@pytest.mark.parametrize("algo", REWARD_ALGOS)
def test_cli_train_code_sandbox_runs(algo, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "code_sandbox", "--algo", algo,
           "--steps", "1", "--out", str(out), "--quiet",
           "rollout.tasks_per_step=2", "algo.group_size=2", "sft.steps=2", "train.eval_tasks=2",
           "train.eval_samples=1", "model.hidden_size=32", "model.num_layers=1",
           "model.num_heads=2", "model.intermediate_size=64"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algo"] == algo and summary["steps"] == 1
    step = [json.loads(line) for line in (out / "metrics.jsonl").open()][0]
    assert step["step"] == 1 and "rollout/reward_mean" in step
    saved = json.loads((out / "config.json").read_text())["algo"]
    ck = Path(summary["checkpoint"])
    if algo == "ppo":
        assert (ck / "value_head.pt").exists()
        assert (saved["update_epochs"], saved["minibatches"]) == (2, 2)  # PPOConfig's own defaults
    if algo == "gspo":
        assert (saved["clip_low"], saved["clip_high"]) == (3e-4, 4e-4)
    if algo == "dpo":
        assert "rollout/dpo_pairs" in step and (ck / "ref_model.pt").exists()


@pytest.mark.slow
def test_distill_from_a_trained_teacher_raises_toy_reward(toy_model, tmp_path):
    """A GRPO-trained checkpoint teaches the untrained model on-policy (no env reward in the
    advantage: `distill_reward_coef=0`): the student's rollout reward rises toward the
    teacher's."""
    from agentrl.config import load_config
    from agentrl.train import train

    teacher = train(load_config(None, TOY + [f"model.path={toy_model}", f"out={tmp_path / 't'}"]))
    rows = [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").open()]
    teacher_rewards = [r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r]
    teacher_reward = sum(teacher_rewards[-3:]) / 3
    base = [o for o in TOY if not o.startswith("train.steps=")]
    train(load_config(None, base + ["train.steps=60", "algo.name=distill",
                                    f"algo.teacher_path={teacher['checkpoint']}",
                                    f"model.path={toy_model}", f"out={tmp_path / 's'}"]))
    rows = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").open()]
    rewards = [r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r]
    kl = [r["adv/reverse_kl"] for r in rows if "adv/reverse_kl" in r]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, f"distill: {first:.3f} -> {last:.3f} (teacher {teacher_reward:.3f})"
    assert sum(kl[-3:]) < sum(kl[:3]), f"reverse KL to the teacher did not fall: {kl}"


RETRY_TOY = '''
import re
from agentrl.env.base import TextEnv

WORDS = ("apple", "river", "stone", "cloud")


class RetryToy(TextEnv):
    """The toy env made multi-turn: say the target word; a wrong answer is told "No. Say the
    word X." (the same observation in every episode of the task: an anchor state) and gets
    another attempt, up to `max_turns`. Reward 1 on the turn that says it."""

    def __init__(self, max_turns: int = 2):
        self.max_turns, self.target, self.turn = max_turns, None, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        self.target = str(options.get("task") or WORDS[int(self.np_random.integers(len(WORDS)))])
        self.turn = 0
        return [{"role": "user", "content": f"Say the word {self.target}."}], {"task_id": self.target}

    def step(self, action):
        self.turn += 1
        hit = re.search(rf"\\b{self.target}\\b", str(action), re.I) is not None
        info = {"task_id": self.target, "success": hit}
        if hit:
            return [], 1.0, True, False, info
        if self.turn >= self.max_turns:
            return [], 0.0, False, True, info
        return [{"role": "user", "content": f"No. Say the word {self.target}."}], 0.0, False, False, info
'''


@pytest.mark.slow
def test_gigpo_learns_a_multi_turn_toy(toy_model, tmp_path, monkeypatch):
    """GiGPO on the toy env made multi-turn (2 attempts, the retry prompt is an anchor state):
    the mean episode reward rises."""
    from agentrl.config import load_config
    from agentrl.train import train

    (tmp_path / "retry_toy.py").write_text(RETRY_TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = [o for o in TOY if not o.startswith(("env.name=", "train.steps="))]
    train(load_config(None, base + ["env.name=retry_toy:RetryToy", "env.max_turns=2",
                                    "train.steps=60", "algo.name=gigpo",
                                    f"model.path={toy_model}", f"out={tmp_path / 'run'}"]))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    rewards = [r["rollout/reward_mean"] for r in rows if "rollout/reward_mean" in r]
    turns = [r["rollout/turns"] for r in rows if "rollout/turns" in r]
    steps = [r["adv/step_adv_abs_mean"] for r in rows if "adv/step_adv_abs_mean" in r]
    assert max(turns) > 1.5  # multi-turn: most early episodes take both attempts
    assert any(s > 0 for s in steps)  # the anchor states gave a step-level signal
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, f"gigpo multi-turn: {first:.3f} -> {last:.3f}: {rewards}"


def test_turn_credit_gigpo_on_grpo_is_the_gigpo_run(toy_model, tmp_path, monkeypatch):
    """`--algo grpo algo.turn_credit=gigpo` and `--algo gigpo` with the same settings are the
    same run: 3 steps on the multi-turn toy give the same rewards, advantages and losses, and
    bit-equal weights."""
    import torch

    from agentrl.config import load_config
    from agentrl.models.tiny import load_model
    from agentrl.train import train

    (tmp_path / "retry_toy.py").write_text(RETRY_TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = [o for o in TOY if not o.startswith(("env.name=", "train.steps="))]
    base += ["env.name=retry_toy:RetryToy", "env.max_turns=2", "train.steps=3",
             f"model.path={toy_model}", "train.eval_tasks=2"]
    runs = {}
    for tag, algo in (("gigpo", ["algo.name=gigpo"]), ("grpo", ["algo.turn_credit=gigpo"])):
        summary = train(load_config(None, base + algo + [f"out={tmp_path / tag}"]))
        assert summary["algo"] == tag
        rows = [json.loads(line) for line in (tmp_path / tag / "metrics.jsonl").open()]
        keep = ("rollout/", "adv/", "loss/", "eval/")
        metrics = [{k: v for k, v in r.items()  # (timings differ from run to run)
                    if k.startswith(keep) and not k.endswith(("_s", "seconds"))} for r in rows]
        saved = json.loads((tmp_path / tag / "config.json").read_text())["algo"]
        runs[tag] = (metrics, saved, load_model(summary["checkpoint"])[0].state_dict())
    (m_a, cfg_a, w_a), (m_b, cfg_b, w_b) = runs["gigpo"], runs["grpo"]
    assert cfg_a["gamma"] == cfg_b["gamma"] == 0.95 and cfg_b["turn_credit"] == "gigpo"
    assert any(r.get("adv/step_adv_abs_mean", 0) > 0 for r in m_a)  # the step credit was used
    assert any(r.get("loss/loss", 0) != 0 for r in m_a)  # and something was trained
    assert m_a == m_b
    assert w_a.keys() == w_b.keys() and all(torch.equal(w_a[k], w_b[k]) for k in w_a)


def _short(toy_model, out, *extra):
    from agentrl.config import load_config

    base = [o for o in TOY if not o.startswith("train.steps=")]
    return load_config(None, base + [f"model.path={toy_model}", f"out={out}", *extra])


def test_dynamic_sampling_in_the_loop(toy_model, tmp_path):
    """Untrained policy on the toy env: most groups score all 0 and are dropped; the loop
    refills, and every update trains only on groups with signal."""
    from agentrl.train import train

    train(_short(toy_model, tmp_path / "run", "train.steps=3", "algo.dynamic_sampling=true"))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in rows if "rollout/refill_rounds" in r]
    assert len(steps) == 3 and all(r["rollout/refill_rounds"] >= 1 for r in steps)
    for r in steps:  # each trained batch has no zero-variance group
        assert r.get("adv/num_zero_variance_groups", 0) == 0


def test_ppo_resume_restores_value_head_and_kl_state(toy_model, tmp_path):
    import torch

    from agentrl.train import train

    out = tmp_path / "run"
    # (seed 0: the first reward appears at step 3; before it no gradient moves anything)
    train(_short(toy_model, out, "train.steps=3", "algo.name=ppo", "algo.kl_coef=0.05"))
    ck = out / "checkpoints" / "step_3"
    head = torch.load(ck / "value_head.pt")
    assert head["weight"].abs().sum() > 0
    beta = torch.load(ck / "algo_state.pt")["kl_coef"]
    assert beta < 0.05  # KL below the target: the adaptive coefficient shrank
    train(_short(toy_model, out, "train.steps=4", "algo.name=ppo", "algo.kl_coef=0.05",
                 f"resume={out}"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    resumed = [r for r in rows if r.get("step") == 4 and "rollout/kl_coef" in r]
    assert resumed and resumed[0]["rollout/kl_coef"] == pytest.approx(beta)
