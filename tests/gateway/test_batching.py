"""How a gateway session batches its runs' calls (`agentrl.gateway.server.Session.step`): a run
whose agent has returned is not waited for, the driving thread wakes when a run ends, and runs
that have not sent their first request yet are waited for up to `start_wait_s`."""

from __future__ import annotations

import threading
import time

from agentrl.gateway.protocol import parse_request
from agentrl.gateway.server import RunState, Session
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.scripted import ScriptedEngine

REQ = parse_request({"model": "policy", "messages": [{"role": "user", "content": "hi"}]})


class Counting:
    """The scripted engine, counting generate calls and their rows."""

    def __init__(self, tok):
        self.engine, self.batches, self.policy_version = ScriptedEngine(tok, lambda ids: "ok"), [], 0

    def generate(self, prompts, params):
        self.batches.append(len(prompts))
        return self.engine.generate(prompts, params)


def session(tok, runs: int, **kw) -> tuple[Session, list[RunState], Counting]:
    engine = Counting(tok)
    s = Session(engine, ChatRenderer(tok), None, model_names=["policy"], max_episode_tokens=512,
                max_tokens=8, seed=0, **kw)
    rs = [RunState(f"t{i}", s, None) for i in range(runs)]
    s.runs.extend(rs)
    return s, rs, engine


def submit_later(s: Session, run: RunState, delay_s: float) -> threading.Thread:
    def go():
        time.sleep(delay_s)
        run.pending += 1  # as the server counts a request in flight
        s._submit(run, [1, 2, 3], REQ)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_finished_runs_are_not_waited_for(tiny_tokenizer):
    s, (a, b, c), engine = session(tiny_tokenizer, 3, batch_wait_s=30.0, start_wait_s=30.0)
    assert s.expected() == 3 and s.starting()
    b.finish()
    c.finish()
    assert s.expected() == 1 and s.starting()  # `a` has not called yet
    a.pending = 1
    assert not s.starting()
    s._submit(a, [1, 2, 3], REQ)
    t0 = time.monotonic()
    assert s.step(timeout_s=30.0) == 1  # not 30 s for the two runs that have returned
    assert time.monotonic() - t0 < 15.0 and engine.batches == [1]


def test_a_run_ending_wakes_the_driving_thread(tiny_tokenizer):
    s, (a,), _ = session(tiny_tokenizer, 1)
    threading.Timer(0.2, a.finish).start()
    t0 = time.monotonic()
    assert s.step(timeout_s=30.0) == 0
    assert time.monotonic() - t0 < 15.0  # woken by `finish`, not at the 30 s time-out


def test_starting_runs_join_the_first_batch(tiny_tokenizer):
    """Run b sends its first request 0.5 s after run a's: within `start_wait_s` both share one
    generate call; without it (0) each gets its own."""
    for start_wait_s, want in ((20.0, [2]), (0.0, [1, 1])):
        s, (a, b), engine = session(tiny_tokenizer, 2, batch_wait_s=0.01, start_wait_s=start_wait_s)
        a.pending = 1
        s._submit(a, [1, 2, 3], REQ)
        later = submit_later(s, b, 0.5)
        while sum(engine.batches) < 2:
            s.step(timeout_s=5.0)
        later.join()
        assert engine.batches == want, (start_wait_s, engine.batches)
