"""A dead reward source stops the run (issue 42 item 9): the rlaif_judge env with `judge_url`
on a closed port on 127.0.0.1 gives every episode reward NaN; after
`train.max_nonfinite_reward_steps` such steps in a row the run stops with an error naming the
env, the judge URL and the first episode error, exit 2 (it used to train on nothing and exit 0)."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.log.summary import read_metrics
from agentrl.train import check_reward_source


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on it now: connections are refused
    return port


def test_a_judge_on_a_closed_port_stops_the_run_naming_it(tmp_path, tiny_model_dir):
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    out = tmp_path / "dead"
    r = CliRunner().invoke(app, [
        "train", "--env", "rlaif_judge", "--out", str(out), "--steps", "6", "-q", f"model.path={tiny_model_dir}",
        f"env.kwargs={{judge_url: '{url}', judge_kwargs: {{max_retries: 0, timeout: 5}}}}", "sft.steps=0",
        "rollout.tasks_per_step=2", "algo.group_size=2", "rollout.max_tokens=8", "train.eval_tasks=1", "train.eval_samples=1",
        "train.max_nonfinite_reward_steps=2"])
    text = " ".join(r.output.split())
    assert r.exit_code == 2, text
    assert "step 2: every episode reward of the last 2 steps was NaN or infinite" in text
    assert f"env rlaif_judge (env.kwargs.judge_url={url}" in text and "first error:" in text
    assert "train.max_nonfinite_reward_steps=2" in text
    assert [row["step"] for row in read_metrics(out) if "rollout/nan_rewards" in row] == [1]  # the 2nd stops


class _T:
    def __init__(self, ret, info=None):
        self.episode_return, self.info = ret, info or {}


@pytest.mark.parametrize("rets,streak,want", [([float("nan")] * 2, 0, 1), ([float("inf"), float("nan")], 1, 2),
                                              ([float("nan"), 0.0], 2, 0), ([], 2, 0)])
def test_the_streak_counts_steps_without_a_finite_reward(rets, streak, want):
    from agentrl.config import load_config

    cfg = load_config(None, ["train.max_nonfinite_reward_steps=3"])
    assert check_reward_source(cfg, [_T(x) for x in rets], 0, streak) == want
