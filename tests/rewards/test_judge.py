"""AI judge: score parser (R2), HTTP client faults against a local server (R1), the offline rule
judge, the JudgeReward wrapper, the rlaif_judge env, `serve_judge` with a real tiny model, and
reward functions that raise or return the wrong length (R3, R4)."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import httpx
import numpy as np
import pytest
import torch
from _reward_fixtures import ECHO_ID, EchoEnv
from gymnasium.utils.env_checker import check_env

from agentrl.env.registry import make_env, register_env
from agentrl.rewards import (
    JudgeClient,
    JudgeReward,
    RuleJudge,
    call_reward_fn,
    parse_judge_score,
    parse_pairwise_choice,
    strip_think,
)

torch.set_num_threads(1)

register_env("agentrl/RLAIFJudge-v0", "agentrl_envs.rlaif_judge:RLAIFJudgeEnv", short_name="rlaif_judge",
             description="answer a question; an AI judge scores the answer")

# ---------------------------------------------------------------------------------------------
# parse_judge_score: (reply, low, high, expected)
# ---------------------------------------------------------------------------------------------

PARSE_ROWS = [
    ("Score: 7", 0, 10, 7.0),
    ("7/10", 0, 10, 7.0),
    ("Rating: 8.5", 0, 10, 8.5),
    ("Score: 90", 0, 10, None),                       # R2: out of range, not clamped to 10
    ("Score: -3", 0, 10, None),                       # below the range
    ("Score: 10", 0, 10, 10.0),                       # bounds are inclusive
    ("Score: 0", 0, 10, 0.0),
    ("score:7", 0, 10, 7.0),
    ("SCORE = 4", 0, 10, 4.0),
    ("**Score:** 6", 0, 10, 6.0),
    ("Overall score (0-10): 7", 0, 10, 7.0),
    ("The score is 7.", 0, 10, 7.0),
    ("Final rating: 3 out of 10", 0, 10, 3.0),
    ("7 out of 10", 0, 10, 7.0),
    ("Score: 9/10", 0, 10, 9.0),
    ("Score: 90/100", 0, 10, None),                   # another scale: skipped, not rescaled
    ("4/5", 0, 10, None),
    ("4/5", 1, 5, 4.0),
    ("I would rate this answer a 4.", 0, 10, 4.0),
    ("I give it a 9", 0, 10, 9.0),
    ("It earns a score of 10", 0, 10, 10.0),
    ("Rating: [[5]]", 0, 10, 5.0),                    # MT-Bench
    ("[[2]]", 1, 5, 2.0),
    ("7", 0, 10, 7.0),                                # a bare number
    ("  **8**  ", 0, 10, 8.0),
    ("Score: 3\nOn reflection, Score: 8", 0, 10, 8.0),  # the last valid score wins
    ("Score: 7. Final score: 90", 0, 10, 7.0),        # the last *valid* one
    ("<think>Score: 2</think> Score: 9", 0, 10, 9.0),  # reasoning is ignored
    ("<think>I think 9/10</think>", 0, 10, None),
    ("<THINK>Score: 1</THINK>\nScore: 5", 0, 10, 5.0),
    ("<think>still thinking... Score: 3", 0, 10, None),  # unclosed: the rest is reasoning
    ("reasoning, Score: 1 </think>Score: 6", 0, 10, 6.0),  # stray close tag (template opened it)
    ("The answer mentions 1969 and 3 facts.", 0, 10, None),  # free numbers are not scores
    ("The dates 3/4/2020 are wrong", 0, 10, None),
    ("", 0, 10, None),
    ("I like turtles.", 0, 10, None),
    ("Score: seven", 0, 10, None),
    ("good", 0, 10, 10.0),                            # verdict words -> high / low
    ("bad", 0, 10, 0.0),
    ("Yes", 0, 1, 1.0),
    ("no.", 0, 1, 0.0),
    ("Verdict: correct", 1, 5, 5.0),
    ("Verdict: incorrect", 1, 5, 1.0),
    ("Answer: yes", 0, 1, 1.0),
    ("**Judgement:** wrong", 0, 1, 0.0),
    ("The answer is wrong in places, but no score given", 0, 10, None),  # prose is not a verdict
    ("Score: 6\nVerdict: fail", 0, 10, 0.0),          # a later verdict wins
    ("Verdict: pass\nScore: 6", 0, 10, 6.0),
    ("Score: -1", -1, 1, -1.0),                       # negative scales
    ("Score: 0.5", -1, 1, 0.5),
    ("Score: 1.5", -1, 1, None),
]


@pytest.mark.parametrize("reply,low,high,expected", PARSE_ROWS)
def test_parse_judge_score_table(reply, low, high, expected):
    got = parse_judge_score(reply, low, high)
    assert got == expected, f"{reply!r} on [{low},{high}]: {got} != {expected}"


def test_parse_judge_score_rejects_bad_scale():
    with pytest.raises(ValueError, match="low < high"):
        parse_judge_score("Score: 5", 10, 0)
    with pytest.raises(ValueError):
        parse_judge_score("Score: 5", 0, math.inf)


def test_strip_think():
    assert strip_think("a<think>b</think>c").replace(" ", "") == "ac"
    assert strip_think("a <think> b") == "a "
    assert strip_think("b </think> c") == " c"


@pytest.mark.parametrize("reply,expected", [
    ("[[A]]", "A"), ("[[B]]", "B"), ("[[C]]", "tie"), ("Winner: B", "B"), ("Better answer: A", "A"),
    ("Verdict: tie", "tie"), ("Response A is better than B", "A"), ("B", "B"), ("(A)", "A"),
    ("A is fine but so is B", None), ("", None), ("<think>[[A]]</think>\n[[B]]", "B"),
    ("First [[A]], on reflection [[B]]", "B"),
])
def test_parse_pairwise_choice(reply, expected):
    assert parse_pairwise_choice(reply) == expected


# ---------------------------------------------------------------------------------------------
# Offline rule judge: exact values
# ---------------------------------------------------------------------------------------------

def test_rule_judge_exact_values():
    j = RuleJudge()
    msgs = [{"role": "user", "content": "Which planet is the largest in our solar system?"}]
    # keywords ["jupiter"] found: task 1, 5 words in [3, 200]: length 1, 5 distinct/5: diversity 1
    r = j.judge(msgs, "Jupiter is the largest planet.", keywords=["jupiter"])
    assert r.score == pytest.approx(10.0) and r.reward == pytest.approx(1.0) and r.ok
    # 1 of 2 keywords: 10 * (0.6 * 0.5 + 0.2 + 0.2) = 7
    assert j.judge(msgs, "It is Jupiter for sure", keywords=["jupiter", "gas giant"]).score == pytest.approx(7.0)
    # "jupiter jupiter jupiter jupiter": task 1, length 1, diversity min(1, 2*1/4) = 0.5 -> 9
    assert j.judge(msgs, "jupiter jupiter jupiter jupiter", keywords=["jupiter"]).score == pytest.approx(9.0)
    # one word: length_ok 0 -> 10 * (0.6 + 0 + 0.2) = 8
    assert j.judge(msgs, "Jupiter", keywords=["jupiter"]).score == pytest.approx(8.0)
    # no keywords: relevance. Prompt content words {planet, largest, solar, system} (4 >= 3):
    # answer has "largest", "planet" -> 2/3; 10 * (0.6 * 2/3 + 0.2 + 0.2) = 8
    assert j.judge(msgs, "The largest planet is big.").score == pytest.approx(8.0)
    # partial credit: "jupyter" vs "jupiter" share 4 of 10 trigrams of "#word#" -> 0.5 * 0.4
    # -> 10 * (0.6 * 0.2 + 0.2 + 0.2) = 5.2
    assert j.judge(msgs, "It is jupyter", keywords=["jupiter"]).score == pytest.approx(5.2)
    assert j.components(msgs, "It is jupyter", ["jupiter"])["task"] == pytest.approx(0.2)
    assert RuleJudge(partial_credit=0.0).components(msgs, "It is jupyter", ["jupiter"])["task"] == 0.0
    # an empty answer scores 0
    assert j.judge(msgs, "  ...  ").score == 0.0
    # phrase keywords match on word boundaries only
    assert j.components(msgs, "a gas giant indeed", ["gas giant"])["task"] == 1.0
    # not found: partial credit only. "#gas#" vs "#gasgiant#": 2 shared of 9 trigrams;
    # "#giant#" vs "#gasgiant#": 4 of 9 -> 0.5 * mean(2/9, 4/9) = 1/6
    assert j.components(msgs, "a gasgiant indeed", ["gas giant"])["task"] == pytest.approx(1 / 6)


# ---------------------------------------------------------------------------------------------
# A local HTTP server that misbehaves on demand (the only fake here: it injects faults)
# ---------------------------------------------------------------------------------------------

class FaultServer:
    """OpenAI-shaped judge at http://127.0.0.1:PORT/<behaviour>/v1 with behaviours:
    valid, garbage, range, slow, flaky (two 500s then a score), always500, bad400, notjson,
    concurrent (sleeps 0.2 s, tracks requests in flight), pair_first (always [[A]]),
    pair_cats (prefers the answer that mentions cats)."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.bodies: dict[str, list[dict]] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                return

            def _send(self, code, payload, raw=None):
                data = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "fault-model", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                b = self.path.strip("/").split("/")[0]
                with server.lock:
                    n = server.counts.get(b, 0)
                    server.counts[b] = n + 1
                    server.bodies.setdefault(b, []).append(body)
                    # only the 'concurrent' behaviour is counted: a request of an earlier
                    # timeout test may still be sleeping on this shared server
                    server.in_flight += b == "concurrent"
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(b, n, body)
                finally:
                    with server.lock:
                        server.in_flight -= b == "concurrent"

            def _reply(self, text):
                self._send(200, {"id": "x", "object": "chat.completion", "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})

            def _answer(self, b, n, body):
                prompt = body["messages"][-1]["content"]
                if b == "valid":
                    self._reply("The answer is right.\nScore: 8")
                elif b == "garbage":
                    self._reply("I like turtles.")
                elif b == "range":
                    self._reply("Score: 90")
                elif b == "slow":
                    time.sleep(1.5)
                    self._reply("Score: 8")
                elif b == "flaky":
                    if n < 2:
                        self._send(500, {"error": "overloaded"})
                    else:
                        self._reply("Score: 6")
                elif b == "always500":
                    self._send(503, {"error": "down"})
                elif b == "bad400":
                    self._send(400, {"error": "bad request"})
                elif b == "notjson":
                    self._send(200, None, raw=b"hello")
                elif b == "concurrent":
                    time.sleep(0.2)
                    self._reply("Score: 5")
                elif b == "pair_first":
                    self._reply("[[A]]")
                elif b == "pair_cats":
                    a_part = prompt.split("Answer A:")[1].split("Answer B:")[0]
                    self._reply("Verdict: [[A]]" if "cat" in a_part else "Verdict: [[B]]")
                else:
                    self._send(404, {"error": "no such behaviour"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, behaviour: str) -> str:
        return f"{self.base}/{behaviour}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def faults():
    s = FaultServer()
    yield s
    s.close()


MSGS = [{"role": "user", "content": "What is the capital of France?"}]


def client(url, **kw):
    kw = {"timeout": 5.0, "max_retries": 2, "backoff": 0.01, **kw}
    return JudgeClient(url, **kw)


def test_valid_score_and_request_shape(faults):
    c = client(faults.url("valid"), rubric="RUBRIC-X")
    r = c.judge(MSGS, "Paris.")
    assert r.ok and r.score == 8.0 and r.reward == pytest.approx(0.8) and r.attempts == 1
    body = faults.bodies["valid"][-1]
    assert body["model"] == "fault-model"  # discovered through GET /v1/models
    assert body["temperature"] == 0.0 and body["max_tokens"] == 512
    assert body["messages"][0]["role"] == "system"
    user = body["messages"][1]["content"]
    assert "RUBRIC-X" in user and "USER: What is the capital of France?" in user and "Paris." in user
    assert "from 0 to 10" in user


def test_garbage_reply_is_a_recorded_parse_error_not_zero(faults):  # R1
    r = client(faults.url("garbage")).judge(MSGS, "Paris.")
    assert math.isnan(r.score) and math.isnan(r.reward)
    assert r.error_kind == "parse" and "turtles" in r.error and r.reply == "I like turtles."


def test_out_of_range_reply_is_a_parse_error(faults):  # R2
    r = client(faults.url("range")).judge(MSGS, "Paris.")
    assert math.isnan(r.reward) and r.error_kind == "parse" and "Score: 90" in r.error


def test_timeout_then_give_up(faults):
    c = client(faults.url("slow"), timeout=0.3, max_retries=1)
    t0 = time.perf_counter()
    r = c.judge(MSGS, "Paris.")
    assert r.error_kind == "timeout" and math.isnan(r.reward) and r.attempts == 2
    assert time.perf_counter() - t0 < 1.5  # two 0.3 s attempts plus backoff, not the 1.5 s reply


def test_http_500_is_retried_with_backoff(faults):
    c = client(faults.url("flaky"), max_retries=3, backoff=0.05)
    t0 = time.perf_counter()
    r = c.judge(MSGS, "Paris.")
    assert r.ok and r.score == 6.0 and r.attempts == 3
    assert time.perf_counter() - t0 >= 0.05 + 0.1  # waits 0.05 then 0.1 (doubling)
    assert c.stats["retries"] == 2


def test_retries_exhausted_and_client_errors(faults):
    r = client(faults.url("always500"), max_retries=2).judge(MSGS, "Paris.")
    assert r.error_kind == "http" and "503" in r.error and r.attempts == 3
    r = client(faults.url("bad400"), max_retries=2).judge(MSGS, "Paris.")
    assert r.error_kind == "http" and r.attempts == 1  # a 4xx is not retried
    r = client(faults.url("notjson")).judge(MSGS, "Paris.")
    assert r.error_kind == "bad_response" and math.isnan(r.reward)


def test_unreachable_judge():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    r = client(f"http://127.0.0.1:{port}", max_retries=1).judge(MSGS, "Paris.")
    assert r.error_kind == "connect" and math.isnan(r.reward)


def test_cache_keyed_on_content(faults):
    c = client(faults.url("valid"))
    before = faults.counts.get("valid", 0)
    a = c.judge(MSGS, "Paris is the capital.")
    b = c.judge(MSGS, "Paris is the capital.")
    d = c.judge(MSGS, "Lyon.")
    assert not a.cached and b.cached and not d.cached and b.score == a.score
    assert faults.counts["valid"] - before == 2
    # parse errors are not cached (a later call may succeed)
    g = client(faults.url("garbage"))
    n0 = faults.counts.get("garbage", 0)
    g.judge(MSGS, "x")
    g.judge(MSGS, "x")
    assert faults.counts["garbage"] - n0 == 2


def test_concurrency_limit(faults):
    c = client(faults.url("concurrent"), max_concurrency=2)
    faults.max_in_flight = 0
    with ThreadPoolExecutor(max_workers=6) as pool:  # more callers than the client allows
        results = list(pool.map(lambda i: c.judge(MSGS, f"answer {i}"), range(6)))
    assert [r.score for r in results] == [5.0] * 6
    assert faults.max_in_flight == 2


def test_pairwise_preference_pairs(faults):
    c = client(faults.url("pair_cats"))
    pair = c.preference_pair(MSGS, "dogs only", "cats are great")
    assert pair == {"prompt": MSGS, "chosen": "cats are great", "rejected": "dogs only"}
    assert c.compare(MSGS, "cats are great", "dogs only").choice == "A"
    # a judge that always says A is position-biased: swapping exposes it -> tie, no pair
    biased = client(faults.url("pair_first"))
    assert biased.compare(MSGS, "x", "y").choice == "tie"
    assert biased.preference_pair(MSGS, "x", "y") is None
    assert biased.compare(MSGS, "x", "y", swap=False).choice == "A"
    bad = client(faults.url("garbage")).compare(MSGS, "x", "y")
    assert bad.choice is None and bad.error_kind == "parse"


def test_client_config_errors():
    with pytest.raises(ValueError, match="placeholder"):
        JudgeClient("http://127.0.0.1:1", template="{nope} {answer}")
    with pytest.raises(ValueError, match="low < high"):
        JudgeClient("http://127.0.0.1:1", low=5, high=5)


# ---------------------------------------------------------------------------------------------
# JudgeReward wrapper and the rlaif_judge env
# ---------------------------------------------------------------------------------------------

def _checked(env):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env)


def test_judge_wrapper_passes_check_env():
    _checked(JudgeReward(gym.make(ECHO_ID)))
    _checked(JudgeReward(EchoEnv(), mode="add", when="step"))


def test_judge_wrapper_replace_and_add():
    env = JudgeReward(EchoEnv(turns=2))  # rule judge, replace, scored at the end
    obs, info = env.reset(seed=0)
    _, r1, term, _, i1 = env.step("a cat")
    assert (r1, term) == (0.0, False) and "judge" not in i1["reward_components"]
    _, r2, term, _, i2 = env.step("The cat sat on the mat.")
    # keywords ["cat"] from the reset info: task 1, 6 words, 5 distinct -> diversity 1 -> score 10
    assert term and r2 == pytest.approx(1.0)
    assert i2["reward_components"] == {"judge": pytest.approx(1.0)} and i2["env_reward"] == 1.0
    env = JudgeReward(EchoEnv(turns=1), mode="add", weight=0.5)
    env.reset(seed=0)
    _, r, _, _, info = env.step("dogs dogs")  # env 0; judge: task 0, length 0, diversity 1 -> 2/10
    assert r == pytest.approx(0.0 + 0.5 * 0.2)
    assert info["reward_components"] == {"env": 0.0, "judge": pytest.approx(0.1)}


def test_judge_wrapper_failed_judge_gives_nan_with_reason(faults):
    for url in (faults.url("garbage"), faults.url("range")):
        env = JudgeReward(EchoEnv(turns=1), url=url, backoff=0.01)
        env.reset(seed=0)
        _, r, term, _, info = env.step("cat")
        assert math.isnan(r) and term
        assert "judge parse error" in info["error"] and info["judge"]["error_kind"] == "parse"
    env = JudgeReward(EchoEnv(turns=1), url=faults.url("valid"))
    env.reset(seed=0)
    assert env.step("cat")[1] == pytest.approx(0.8)


def test_rlaif_env_offline_check_env_and_seeding():
    env = make_env("rlaif_judge")
    _checked(env)
    _checked(env.unwrapped)
    a, b = make_env("rlaif_judge"), make_env("rlaif_judge")  # case G1
    seq_a = [a.reset(seed=123)[1]["task_id"]] + [a.reset()[1]["task_id"] for _ in range(2)]
    seq_b = [b.reset(seed=123)[1]["task_id"]] + [b.reset()[1]["task_id"] for _ in range(2)]
    assert seq_a == seq_b
    obs, info = a.reset(options={"task": "largest_planet"})
    assert obs[-1]["content"] == "Which planet is the largest in our solar system?"
    _, r, term, trunc, info = a.step("Jupiter is the largest planet.")
    assert (r, term, trunc) == (1.0, True, False) and info["success"] is True
    assert len(make_env("rlaif_judge", split="heldout").unwrapped.tasks) == 8
    assert make_env("rlaif_judge", split="test").unwrapped.tasks == make_env("rlaif_judge", split="heldout").unwrapped.tasks
    with pytest.raises(ValueError, match="split"):
        make_env("rlaif_judge", split="validation")


def test_rlaif_env_with_url(faults):
    env = make_env("rlaif_judge", judge_url=faults.url("valid"))
    env.reset(seed=0)
    _, r, *_ = env.step("Paris.")
    assert r == pytest.approx(0.8)
    # env copies with the same judge share one client (concurrency limit, cache)
    assert make_env("rlaif_judge", judge_url=faults.url("valid")).unwrapped.judge is env.unwrapped.judge
    env = make_env("rlaif_judge", judge_url="http://127.0.0.1:9/v1", judge_kwargs={"max_retries": 0, "timeout": 1})
    env.reset(seed=0)
    _, r, term, _, info = env.step("Paris.")  # an unreachable judge never raises out of step
    assert math.isnan(r) and term and info["judge"]["error_kind"] == "connect" and "unreachable" in info["error"]


# ---------------------------------------------------------------------------------------------
# serve_judge: a real HTTP server over a tiny random model
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from agentrl.models.tiny import build_tiny_model
    from agentrl.rewards.serve_judge import serve_judge

    path = build_tiny_model(tmp_path_factory.mktemp("judge_model"), ["Score: 7. The answer is good."] * 20,
                            hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, vocab_size=300)
    server, thread, url = serve_judge(path)
    yield url
    server.shutdown()
    server.server_close()


def test_serve_judge_endpoint_shape(served):
    r = httpx.post(served + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 5}, timeout=60)
    assert r.status_code == 200
    d = r.json()
    assert d["object"] == "chat.completion" and d["model"] == "judge_model0"
    ch = d["choices"][0]
    assert ch["message"]["role"] == "assistant" and isinstance(ch["message"]["content"], str)
    assert ch["finish_reason"] in ("stop", "length")
    u = d["usage"]
    assert u["completion_tokens"] <= 5 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    # greedy decoding is deterministic
    r2 = httpx.post(served + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 5}, timeout=60)
    assert r2.json()["choices"][0]["message"] == ch["message"]
    assert httpx.get(served + "/models").json()["data"][0]["id"] == "judge_model0"
    assert httpx.post(served + "/chat/completions", content=b"{not json", timeout=10).status_code == 400
    bad = httpx.post(served + "/chat/completions", json={"messages": []}, timeout=10)
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
    assert httpx.post(served + "/nowhere", json={}, timeout=10).status_code == 404
    s = httpx.post(served + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                       "max_tokens": 4, "temperature": 1.0, "seed": 1, "n": 2},
                   timeout=60).json()
    assert len(s["choices"]) == 2


def test_judge_against_served_random_model_records_parse_error(served):  # R1, for real
    c = JudgeClient(served, max_tokens=12, timeout=60)
    r = c.judge(MSGS, "Paris.")
    assert r.error_kind == "parse" and math.isnan(r.reward) and r.attempts == 1
    assert c.stats["parse_errors"] == 1
    env = make_env("rlaif_judge", judge_url=served, judge_kwargs={"max_tokens": 12, "timeout": 60})
    env.reset(seed=0)
    _, reward, term, _, info = env.step("Paris.")
    assert math.isnan(reward) and term and info["error"].startswith("judge parse error")


# ---------------------------------------------------------------------------------------------
# Reward functions that fail (R3, R4)
# ---------------------------------------------------------------------------------------------

def test_reward_fn_raising_on_one_sample_is_isolated():  # R3
    def exact(prompts, completions):
        out = []
        for c in completions:
            if c == "boom":
                raise RuntimeError("cannot score")
            out.append(float(c))
        return out

    res = call_reward_fn(exact, ["p"] * 4, ["1", "boom", "0", "1"])
    assert res.values[0] == 1.0 and math.isnan(res.values[1]) and res.values[2:] == [0.0, 1.0]
    assert list(res.errors) == [1] and "RuntimeError" in res.errors[1]
    # group advantages over the valid samples (unbiased std, eps 1e-6): mean 2/3,
    # std sqrt(((1/3)^2*2 + (2/3)^2)/2) = 0.57735 -> [0.5774, masked, -1.1547, 0.5774]
    v = np.array(res.values)
    ok = ~np.isnan(v)
    adv = (v[ok] - v[ok].mean()) / (v[ok].std(ddof=1) + 1e-6)
    np.testing.assert_allclose(adv, [0.5774, -1.1547, 0.5774], atol=1e-4)
    try:
        from agentrl.algos.advantages import group_advantages
    except ImportError:
        return
    a = group_advantages(torch.tensor(res.values), torch.zeros(4, dtype=torch.long), scale="std")
    np.testing.assert_allclose(a.numpy()[[0, 2, 3]], [0.5774, -1.1547, 0.5774], atol=1e-4)
    assert a[1] == 0 or torch.isnan(a[1])


def test_reward_fn_wrong_length_is_an_error():  # R4
    def one_value(prompts, completions):
        return [1.0]

    with pytest.raises(ValueError, match=r"'test_reward_fn_wrong_length_is_an_error.<locals>.one_value' returned 1 "
                                         r"values for 4 completions"):
        call_reward_fn(one_value, ["p"] * 4, ["a", "b", "c", "d"])


def test_reward_fn_bad_values_become_nan():
    res = call_reward_fn(lambda p, c: [None, "x", math.inf, 0.5], ["p"] * 4, list("abcd"))
    assert [math.isnan(x) for x in res.values] == [True, True, True, False] and sorted(res.errors) == [0, 1, 2]
    # a raising function whose per-sample call also returns the wrong length is still an R4 error
    def broken(prompts, completions):
        if len(completions) > 1:
            raise KeyError("batch")
        return [1.0, 2.0]
    with pytest.raises(ValueError, match="returned 2 values for 1 completions"):
        call_reward_fn(broken, ["p", "q"], ["a", "b"])
