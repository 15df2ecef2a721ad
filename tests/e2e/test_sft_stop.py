"""The warm start's stop check: pass@1 and pass@k on seeded training tasks, by hand."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentrl.env.base import TextEnv
from agentrl.env.registry import make_env, register_env
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.scripted import ScriptedEngine


class SayEnv(TextEnv):
    """Say the target (0-9, drawn from the seed); one turn, reward 1 when right."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(0, 10))
        return [{"role": "user", "content": f"say {self.target}"}], {"task_id": f"say/{self.target}"}

    def step(self, action):
        ok = action.strip() == str(self.target)
        return [], float(ok), True, False, {"success": ok}


register_env("test/SftSay-v0", SayEnv, short_name="test_sft_say", max_turns=1)


def test_stop_check_reports_pass_at_1_and_pass_at_k(tiny_tokenizer):
    """The policy answers right on every second call for even targets and never for odd ones.
    With 4 samples per task: even tasks c = 2 of n = 4, so pass@1 = 1/2 and pass@4 = 1; odd
    tasks 0. Overall pass@1 = even/2/n_tasks, pass@4 = even/n_tasks."""
    from agentrl.config import load_config
    from agentrl.eval.episodes import EVAL_SEED
    from agentrl.sft import evaluate

    calls = {"n": 0}

    def policy(ids):
        target = int(re.search(r"say (\d)", tiny_tokenizer.decode(ids)).group(1))
        calls["n"] += 1
        return str(target) if target % 2 == 0 and calls["n"] % 2 == 0 else "no"

    cfg = load_config(None, ["rollout.max_tokens=4"], **{"env.name": "test_sft_say"})
    n_tasks, k = 10, 4
    envs = [make_env("test_sft_say") for _ in range(n_tasks * k)]
    with ThreadPoolExecutor(2) as pool:
        r = evaluate(ScriptedEngine(tiny_tokenizer, policy), ChatRenderer(tiny_tokenizer), envs, cfg,
                     pool, n_tasks=n_tasks, samples=k, temperature=1.0)
    targets = [SayEnv().reset(seed=EVAL_SEED + i)[0][0]["content"] for i in range(n_tasks)]
    even = sum(int(t.split()[1]) % 2 == 0 for t in targets)
    assert 0 < even < n_tasks  # both kinds occur with these seeds
    # the engine is called once per turn for the whole batch, row by row: within a task's 4
    # consecutive rows, calls alternate, so exactly 2 of the 4 samples of an even task pass
    assert r["pass@1"] == pytest.approx(even * 0.5 / n_tasks)
    assert r["pass@4"] == pytest.approx(even / n_tasks)


def test_a_diverging_warm_start_stops_with_a_clear_error_and_saves_no_model(tiny_model_dir, tmp_path):
    """sft.lr=1e30 makes the weights NaN after one AdamW step: the warm start stops at the
    first non-finite loss, naming the step and sft.lr, exit 2 without a traceback, and no
    OUT/sft_model is written (a diverged model is not saved)."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--env", "toy", "--steps", "1", "--out", str(out),
                                 f"model.path={tiny_model_dir}", "sft.steps=5", "sft.lr=1e30",
                                 "sft.batch_size=4"])
    flat = " ".join(r.output.split())
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "stopped: warm start step 1: loss nan" in flat and "lower sft.lr, now 1e+30" in flat, flat
    assert not (out / "sft_model").exists()


@pytest.mark.parametrize("k", [3, 4])
def test_the_stop_check_samples_every_episode_under_tree_rollouts(tiny_tokenizer, k):
    """`rollout.branch` shapes training groups only: the stop check's k samples per task are
    independent (pass@k), so every episode samples its own first turn (k calls per task), and
    a k that branch does not divide (3 with branch 2) runs instead of failing mid warm start."""
    from agentrl.config import load_config
    from agentrl.sft import evaluate

    calls = {"n": 0}

    def policy(ids):
        calls["n"] += 1
        return "no"

    cfg = load_config(None, ["rollout.max_tokens=4", "rollout.branch=2", "env.max_turns=2"],
                      **{"env.name": "test_sft_say"})
    n_tasks = 2
    envs = [make_env("test_sft_say") for _ in range(n_tasks * k)]
    with ThreadPoolExecutor(2) as pool:
        r = evaluate(ScriptedEngine(tiny_tokenizer, policy), ChatRenderer(tiny_tokenizer), envs, cfg,
                     pool, n_tasks=n_tasks, samples=k, temperature=1.0)
    assert calls["n"] == n_tasks * k and r["pass@1"] == 0.0
