"""What a failing `--agent` run leaves behind, and the refusals a new user meets around it
(found by a new-user probe): a failed run counts in `env/errors` and `eval/errors` (each
episode once, as for a `TextEnv` whose reset failed), a step whose runs were all refused is still
written to rollouts/, `perf/env_s` is wall time of the step (not the agents' thread time summed),
one sentence for a run folder without checkpoints/ from every command, and `agentrl serve`'s
refusals worded for serve. Real gateway on 127.0.0.1, real `openai` SDK, the tiny model."""

from __future__ import annotations

import io
import json
import socket
import time

import httpx
import openai
import pytest
from rich.console import Console
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import load_config
from agentrl.env.base import TextEnv
from agentrl.eval.episodes import episode_success
from agentrl.eval.harness import episode_row
from agentrl.eval.report import summarize
from agentrl.gateway.agents import AgentEnv
from agentrl.log.show import show_episode
from agentrl.log.steps import rollout_metrics
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine

AGENTS = '''
import asyncio, openai

async def ok(client, task):
    await asyncio.sleep(0.4)  # the agent's own work (a tool), on every run at once
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    return 1.0

async def raises(client, task):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    raise RuntimeError("agent bug")

async def wrong_key(client, task):
    other = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="not-the-token", max_retries=0)
    await other.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    return 1.0

async def dispatch(client, task):
    return await globals()[task["agent"]](client, task)
'''


class TwoTurnEnv(TextEnv):
    """Two turns: a tool message after the first, the end after the second."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return [{"role": "user", "content": "find cats"}], {"task_id": "t0"}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return [{"role": "tool", "content": "cats: 3"}], 0.0, False, False, {}
        return [], 0.0, True, False, {"success": False}


@pytest.fixture
def agents(tmp_path, monkeypatch):
    (tmp_path / "fail_agents.py").write_text(AGENTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _tasks(path, names):
    path.write_text("\n".join(json.dumps({"id": f"{n}{i}", "agent": n}) for i, n in enumerate(names)))
    return str(path)


def test_failed_runs_count_once_in_errors_and_env_s_is_wall_time(agents, tiny_tokenizer):
    """4 runs that work 0.4 s each at once, one that raises after a call, one refused (wrong
    key): env/errors and eval's errors both 2 (was 0: the error sat in `info["error"]` of an
    episode with turns); the env seconds add up to no more than the batch's wall time outside
    generate calls (were 4 x 0.4 s summed over the concurrent runs)."""
    tok = tiny_tokenizer
    names = ["ok"] * 4 + ["raises", "wrong_key"]
    env = AgentEnv("fail_agents:dispatch", _tasks(agents / "tasks.jsonl", names), split="all")
    specs = [EpisodeSpec({"options": {"task_index": k}}, group_id=k) for k in range(len(names))]
    t0 = time.perf_counter()
    trs = env.run_agents(ScriptedEngine(tok, lambda ids: "ok"), ChatRenderer(tok), specs,
                         SamplingParams(max_tokens=8), max_episode_tokens=1024, seed=0)
    wall = time.perf_counter() - t0
    assert [t.task_id for t in trs] == [f"{n}{i}" for i, n in enumerate(names)]
    assert "RuntimeError: agent bug" in trs[4].info["error"] and len(trs[4].turns) == 1
    assert "AuthenticationError" in trs[5].info["error"] and trs[5].turns == []
    env_s = sum(t.timings["env"] for t in trs)
    gen_s = sum(t.timings["generate"] for t in trs)
    assert 0.35 <= env_s and env_s + gen_s <= wall, (env_s, gen_s, wall)  # the 0.4 s counted once
    assert rollout_metrics(trs, episode_success)["env/errors"] == 2.0
    rows = [episode_row(t, k, 0, {}) for k, t in enumerate(trs)]
    o = summarize(rows, [1])["overall"]
    assert o["errors"] == 2 and o["env_errors"] == 2
    assert o["end_reasons"] == {"agent_error": 2, "terminated": 4}
    assert rows[4]["errors"] == [trs[4].info["error"]]  # once


def test_env_errors_counts_episodes_of_text_envs_too(tiny_tokenizer):
    """A `TextEnv` whose reset fails (its error in `info["error"]`, no turn) counts (was 0); one
    whose steps failed twice counts once (was 2): training's env/errors is eval's errors."""

    class BadReset(TwoTurnEnv):
        def reset(self, *, seed=None, options=None):
            raise RuntimeError("no task")

    class FailsTwice(TwoTurnEnv):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            return obs, r, term, trunc, {**info, "error": f"turn {self.turn} failed"}

    r = ChatRenderer(tiny_tokenizer)
    eng = ScriptedEngine(tiny_tokenizer, lambda p: "no")
    trs = run_episodes(eng, r, [BadReset(), FailsTwice(), TwoTurnEnv()],
                       [EpisodeSpec({"seed": 0}, k) for k in range(3)], SamplingParams(max_tokens=8))
    assert trs[0].turns == [] and "no task" in trs[0].info["error"]
    assert trs[1].info["errors"] == ["turn 1 failed", "turn 2 failed"]
    for t in trs[:2]:
        assert rollout_metrics([t], episode_success)["env/errors"] == 1.0
    rows = [episode_row(t, k, 0, {}) for k, t in enumerate(trs)]
    assert rollout_metrics(trs, episode_success)["env/errors"] == 2.0 == summarize(rows, [1])["overall"]["errors"]


def test_a_step_whose_runs_are_all_refused_is_in_rollouts(agents, tmp_path, tiny_model_dir):
    """Every call refused (the agent uses another key): the update is skipped, and the step's
    episodes are still in rollouts/step_1.jsonl with the reason (the file was empty); env/errors
    and eval/errors count every episode."""
    from agentrl.train import train

    cfg = load_config(overrides=[
        "env.name=agent", "env.kwargs.agent=fail_agents:wrong_key",
        f"env.dataset={_tasks(tmp_path / 'tasks.jsonl', ['wrong_key'])}", "algo.name=grpo",
        "train.steps=1", f"out={tmp_path / 'run'}", f"model.path={tiny_model_dir}", "sft.steps=0",
        "rollout.tasks_per_step=1", "algo.group_size=2", "rollout.max_episode_tokens=512",
        "train.eval_tasks=1", "train.eval_samples=1", "quiet=true"])
    train(cfg)
    eps = [json.loads(x) for x in (tmp_path / "run" / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(eps) == 2
    for e in eps:
        assert "agent raised AuthenticationError" in e["info"]["error"] and e["info"]["trained"] is False
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [step] = [r for r in rows if "loss/lr" in r]
    assert step["loss/skipped_empty_batch"] == 1.0 and step["env/errors"] == 2.0
    assert step["perf/generate_s"] + step["perf/env_s"] <= step["perf/rollout_s"]
    assert [r["eval/errors"] for r in rows if "eval/errors" in r] == [1.0, 1.0]  # before and after RL
    shown = io.StringIO()
    show_episode(tmp_path / "run", 1, 0, console=Console(file=shown, width=200), plain=True)
    assert "\nerror: agent raised AuthenticationError: " in shown.getvalue(), shown.getvalue()


def test_a_run_folder_without_checkpoints_is_one_sentence_everywhere(tmp_path):
    """`doctor --model F`, `eval --model F`, `serve --model F` and `train model.path=F` on a run
    folder with config.json and metrics.jsonl but no checkpoints/: the same sentence (each had
    its own: no tokenizer / no weights / neither a model nor a run)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": {"name": "toy"}, "algo": {"name": "grpo"}, "model": {}}))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    said = f"{run} is a training run's folder with no checkpoint to use as a model (no checkpoints/ in it"
    runner = CliRunner()
    for args in (["doctor", "--model", str(run)], ["eval", "--model", str(run), "--out", str(tmp_path / "ev")],
                 ["serve", "--model", str(run), "--port", "0"],
                 ["train", f"model.path={run}", "--out", str(tmp_path / "o")]):
        res = runner.invoke(app, args)
        assert res.exit_code != 0 and said in " ".join(res.output.split()), (args, res.output)


def test_serve_serves_policy_and_words_its_refusals_for_serve(tmp_path, tiny_tokenizer):
    """`agentrl serve --api-key`: one model, `policy` (the folder's name was listed too, and
    taken); a missing or wrong key is refused naming `--api-key` (not "the run's token"); a port
    in use names 127.0.0.1:PORT and what to do (was `[Errno 98] Address already in use`)."""
    from agentrl.gateway.serve import start

    tok = tiny_tokenizer
    served = start(str(tmp_path / "latest"), api_key="k3y", engine=ScriptedEngine(tok, lambda ids: "ok"),
                   tokenizer=tok, max_tokens=4)
    try:
        client = openai.OpenAI(base_url=served.url, api_key="k3y", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["policy"]
        with pytest.raises(openai.NotFoundError, match="'latest' not found; this gateway serves"):
            client.chat.completions.create(model="latest", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.AuthenticationError) as e:
            openai.OpenAI(base_url=served.url, api_key="wrong", max_retries=0).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}])
        missing = httpx.post(f"{served.url}/chat/completions", json={"model": "policy", "messages": []})
        assert missing.status_code == 401
        for msg in (e.value.body["message"], missing.json()["error"]["message"]):
            assert "agentrl serve --api-key KEY" in msg and "run's" not in msg and "live run" not in msg, msg
        assert missing.json()["error"]["message"].startswith("missing API key: pass the key this server")
        port = served.gateway.port
        with pytest.raises(OSError) as e:
            start("m", port=port, engine=ScriptedEngine(tok, lambda ids: "ok"), tokenizer=tok)
        assert str(e.value).startswith(f"cannot listen on 127.0.0.1:{port}: the port is in use")
        assert "Errno" not in str(e.value) and "--port" in str(e.value)
        res = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "nothing"), "--port", str(port)])
        assert res.exit_code == 2 and res.output.startswith(f"serve: cannot listen on 127.0.0.1:{port}: "), \
            res.output  # before the model loads (this one does not exist)
        with socket.create_connection(("127.0.0.1", port)):  # the first server still answers
            pass
    finally:
        served.close()
