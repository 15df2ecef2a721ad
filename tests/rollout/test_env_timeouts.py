"""Env time limits (`env.step_timeout_s`, `env.reset_timeout_s`): a hung env call ends its own
episode as a recorded, penalised failure, the other episodes of the batch finish, the stuck
call's thread is never used again, and the stuck env instance is replaced by a fresh one for
later batches (in the agent loop, in the training loop's leased env sets).

The fault is injected by the env itself: `HangEnv` sleeps (up to 30 s) in `step` when the agent
says "hang", or in `reset` when asked to; `release()` ends every sleep at the end of a test.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from agentrl.config import load_config
from agentrl.env.base import TextEnv
from agentrl.env.registry import register_env
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams
from agentrl.rollout.engines.scripted import ScriptedEngine

WORDS = ("cat", "dog", "hang", "sun")
_RELEASE = threading.Event()


class HangEnv(TextEnv):
    """Say a word; reward 1 when the answer contains it. A step whose answer says "hang", or a
    reset with `options={"hang": True}`, sleeps 30 s first (until `release()`). Records the
    thread of every call, and flags an instance used again after it hung (`REUSED`)."""

    INSTANCES: list[HangEnv] = []
    REUSED: list[str] = []

    def __init__(self, words: tuple[str, ...] = WORDS, hang_word: str = "hang"):
        self.words, self.hang_word = tuple(words), hang_word
        self.hung = self.closed = False
        self.threads: list[int] = []
        HangEnv.INSTANCES.append(self)

    def _enter(self, what: str) -> None:
        if self.hung:
            HangEnv.REUSED.append(what)
        self.threads.append(threading.get_ident())

    def _hang(self) -> None:
        self.hung = True
        _RELEASE.wait(30.0)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._enter("reset")
        options = options or {}
        if options.get("hang"):
            self._hang()
        self.target = str(options.get("word") or self.words[int(self.np_random.integers(len(self.words)))])
        return [{"role": "user", "content": f"Say {self.target}."}], {"task_id": f"say/{self.target}"}

    def step(self, action):
        self._enter("step")
        if self.hang_word in action:
            self._hang()
        hit = self.target in action
        return [], float(hit), True, False, {"success": hit}

    def close(self):
        self.closed = True


register_env("test_env_timeouts/Hang-v0", HangEnv, short_name="test_hang",
             description="says a word; hangs on 'hang'")


@pytest.fixture
def release():
    """Ends every hung call at the end of the test (the abandoned threads then finish)."""
    _RELEASE.clear()
    HangEnv.INSTANCES.clear()
    HangEnv.REUSED.clear()
    yield _RELEASE
    _RELEASE.set()


def say_target(tok):
    """A scripted policy: repeats the word the prompt asks for."""
    def policy(prompt_ids):
        text = tok.decode(prompt_ids)
        return text.rsplit("Say ", 1)[1].split(".", 1)[0]
    return policy


def test_a_hung_step_ends_only_its_episode_and_its_env_is_replaced(tiny_tokenizer, release):
    from agentrl.env.registry import make_env

    r = ChatRenderer(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, say_target(tiny_tokenizer))
    params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=r.stop_ids)
    envs = [make_env("test_hang") for _ in range(4)]
    first = list(envs)
    specs = [EpisodeSpec({"seed": i, "options": {"word": w}}, group_id=i)
             for i, w in enumerate(("cat", "dog", "hang", "sun"))]
    t0 = time.perf_counter()
    trajs = run_episodes(engine, r, envs, specs, params, error_reward=-1.0, step_timeout_s=1.0,
                         make_env=lambda: make_env("test_hang"))
    took = time.perf_counter() - t0
    assert took < 8.0, f"the batch waited for the hung step ({took:.1f} s)"  # ~1 s; 30 s if it waited
    hung = trajs[2]
    assert hung.info["env_timeout"] == "step" and hung.terminated and not hung.truncated
    assert hung.info["errors"] == ["step timed out after 1 s"]
    assert hung.turns[-1].reward == -1.0 and hung.turns[-1].info["env_timeout"] == "step"
    for i in (0, 1, 3):  # the other episodes are normal
        assert trajs[i].turns[-1].reward == 1.0 and "errors" not in trajs[i].info
        assert "env_timeout" not in trajs[i].info and envs[i] is first[i]
    stuck = first[2].unwrapped
    assert envs[2] is not first[2] and stuck.hung  # replaced: never reused
    stuck_thread = stuck.threads[-1]
    assert stuck_thread in {t.ident for t in threading.enumerate()}  # still sleeping

    # the next batch on the same list: the fresh env, no call on the stuck thread
    again = run_episodes(engine, r, envs, specs[:2] + [EpisodeSpec({"seed": 9, "options": {"word": "sun"}}, 2)],
                         params, step_timeout_s=1.0, make_env=lambda: make_env("test_hang"))
    assert [t.turns[-1].reward for t in again] == [1.0, 1.0, 1.0]
    assert not HangEnv.REUSED
    used = {tid for e in envs[:3] for tid in e.unwrapped.threads[-2:]}
    assert stuck_thread not in used
    release.set()  # the abandoned call returns, and closes its env
    deadline = time.monotonic() + 10
    while not stuck.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stuck.closed


def test_a_hung_reset_gives_an_empty_recorded_episode(tiny_tokenizer, release):
    from agentrl.env.registry import make_env

    r = ChatRenderer(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, say_target(tiny_tokenizer))
    params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=r.stop_ids)
    envs = [make_env("test_hang") for _ in range(2)]
    first = list(envs)
    specs = [EpisodeSpec({"options": {"word": "cat", "hang": True}}), EpisodeSpec({"options": {"word": "dog"}})]
    t0 = time.perf_counter()
    trajs = run_episodes(engine, r, envs, specs, params, reset_timeout_s=0.5,
                         make_env=lambda: make_env("test_hang"))
    assert time.perf_counter() - t0 < 8.0
    assert trajs[0].info["env_timeout"] == "reset" and not trajs[0].turns and trajs[0].terminated
    assert trajs[0].info["error"] == "reset timed out after 0.5 s"
    assert trajs[1].turns[-1].reward == 1.0
    assert envs[0] is not first[0] and envs[1] is first[1]


def test_evaluation_reports_a_timed_out_episode(tiny_tokenizer, tmp_path, release):
    """`run_eval` with `step_timeout_s`: the hung episode ends as `step_timeout`, counted in
    `env_errors`, and the batch does not wait for it."""
    from agentrl.env.registry import make_env
    from agentrl.eval.harness import run_eval
    from agentrl.eval.report import read_results

    r = ChatRenderer(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, say_target(tiny_tokenizer))
    tasks = [{"options": {"word": "hang"}}, {"options": {"word": "cat"}}]
    t0 = time.perf_counter()
    s = run_eval(engine, r, lambda: make_env("test_hang"), tasks, max_tokens=16, out_dir=tmp_path,
                 step_timeout_s=0.5)
    assert time.perf_counter() - t0 < 8.0
    assert [row["end"] for row in read_results(tmp_path)] == ["step_timeout", "terminated"]
    assert s["overall"]["env_errors"] == 1 and s["overall"]["pass@1"] == 0.5


def test_a_time_limit_needs_a_way_to_replace_envs(tiny_tokenizer):
    r = ChatRenderer(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, lambda ids: "cat")
    with pytest.raises(ValueError, match="make_env"):
        run_episodes(engine, r, [HangEnv()], [EpisodeSpec({})], SamplingParams(), step_timeout_s=1.0)


def test_training_counts_timeouts_and_never_reuses_a_hung_env(tiny_model_dir, tmp_path, release):
    """`agentrl train` on an env that hangs whenever the sampled answer contains an "e" (about
    half of the tiny model's answers): every such step times out after 0.5 s, is counted in `env/timeouts`
    and penalised, the run goes on, and no env instance is ever used again after it hung (the
    leased env sets get fresh ones)."""
    from agentrl.train import train

    out = tmp_path / "run"
    cfg = load_config(None, [
        "env.name=test_env_timeouts:HangEnv", "env.kwargs={hang_word: e}", "env.step_timeout_s=0.5",
        "sft.steps=0", "rollout.tasks_per_step=4", "algo.group_size=2", "rollout.max_tokens=12",
        "train.steps=2", "train.eval_tasks=2", "train.eval_samples=1", "train.log_rollouts_every=1",
        f"model.path={tiny_model_dir}", f"out={out}", "quiet=true"])
    t0 = time.perf_counter()
    train(cfg)
    took = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").open() if '"rollout/reward_mean"' in x]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        trajs = [json.loads(x) for x in (out / "rollouts" / f"step_{r['step']}.jsonl").open()]
        timed_out = [t for t in trajs if t["info"].get("env_timeout") == "step"]
        assert r["env/timeouts"] == len(timed_out)
        for t in timed_out:
            assert "e" in t["turns"][-1]["text"] and t["turns"][-1]["reward"] == 0.0
            assert t["info"]["errors"] == ["step timed out after 0.5 s"]
    hung = [e for e in HangEnv.INSTANCES if e.hung]
    assert sum(r["env/timeouts"] for r in rows) >= 1 and hung  # the fault happened
    assert not HangEnv.REUSED  # no hung instance was reset or stepped again
    # 8 train envs + 2 held-out ones at the start, plus one fresh env per hung one
    assert len(HangEnv.INSTANCES) >= 10 + len(hung)
    assert took < 120


def test_call_threads_are_reused_after_calls_in_time_and_never_after_a_timeout(release):
    """`call_with_timeout` runs each call on a call thread (never the caller's), which serves
    later calls once its call returned in time or raised; a call over its limit raises
    `EnvCallTimeout` at the limit, and its thread runs nothing else: it calls `on_late` when
    the call returns, then exits."""
    import os

    from agentrl.rollout.agent_loop import EnvCallTimeout, call_with_timeout

    me = threading.get_ident()
    first = call_with_timeout(threading.get_ident, 5.0)
    assert first != me
    assert call_with_timeout(threading.get_ident, 5.0) == first  # the idle thread, reused
    assert call_with_timeout(lambda: 6 * 7, None) == 42  # no limit: on the caller's thread
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 5.0)
    assert call_with_timeout(threading.get_ident, 5.0) == first  # an error returns it too

    stuck, late = [], threading.Event()

    def hang():
        stuck.append(threading.get_ident())
        release.wait(30.0)
        return "late"

    t0 = time.perf_counter()
    with pytest.raises(EnvCallTimeout, match="timed out after 0.3 s"):
        call_with_timeout(hang, 0.3, on_late=late.set)
    assert 0.25 < time.perf_counter() - t0 < 5.0
    assert stuck == [first]  # the idle thread took the call, and is now abandoned
    others = {call_with_timeout(threading.get_ident, 5.0) for _ in range(5)}
    assert first not in others  # a new thread serves the next calls while it hangs
    release.set()
    assert late.wait(10.0)  # the call returned: on_late ran, and the thread exits
    deadline = time.monotonic() + 10
    while first in {t.ident for t in threading.enumerate()} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first not in {t.ident for t in threading.enumerate()}
    assert first not in {call_with_timeout(threading.get_ident, 5.0) for _ in range(5)}

    pid = os.fork()  # a child has none of the parent's idle threads: a call there starts one
    if pid == 0:
        try:
            os._exit(0 if call_with_timeout(lambda: 7, 5.0) == 7 else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
