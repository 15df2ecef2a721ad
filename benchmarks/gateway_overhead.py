"""What the gateway costs: per call, against the engine called directly, and per episode, a
4-call agent through the gateway against the same episode as a `TextEnv`.

    python benchmarks/gateway_overhead.py            # the embedded model's default size
    python benchmarks/gateway_overhead.py --runs 16 --repeats 3

1. Per call: B agent runs (`--runs`; and B=1, calls one after another) make 4 calls each through
   the real `openai` SDK (and, to tell the SDK's own cost from the gateway's, the same calls
   as plain HTTP with httpx: `per_call_http_*`) and the real server on 127.0.0.1 (`AgentEnv.run_agents`, the training
   path: rendering with prefix reuse, batching, recording). A pass-through recorder keeps every
   `engine.generate` call (prompts, params); "raw" replays the same calls on the same engine back
   to back (same prompts, params and seeds: the same tokens, checked). overhead = t_gateway /
   t_raw - 1, in wall time and in process CPU time: gateway and replay alternate (A B A B ...)
   `--repeats` times, each pair gives one ratio, reported as the median and range (target
   < 5 % on the embedded model). On a loaded machine the generation's own CPU time varies by
   more than the overhead between two runs; so also the process CPU time of the gateway's
   runs outside the generate calls (`own_cpu`: every thread but the generating one's time in
   `generate`) as a share of the replay's CPU time, and the part of it on the gateway's side
   (`gateway_side_cpu`: the server's event-loop thread, and the driving thread outside
   `generate`; the rest is the agents' threads: the SDK or HTTP client and their event loops).
2. Per episode: the same 4-turn conversation (user, reply, "Go on.", ...) as a `TextEnv` through
   the agent loop (`run_episodes`) and as an agent through the gateway: samples (episodes) per
   second and sampled tokens per second, best of `--repeats`.
Writes benchmarks/results/gateway_overhead.json, with the commit, the command and the load
averages.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from overhead_common import pct, provenance, spread  # noqa: E402

from agentrl.env.base import TextEnv  # noqa: E402
from agentrl.gateway.agents import AgentEnv  # noqa: E402
from agentrl.gateway.server import shared_gateway  # noqa: E402
from agentrl.models.tiny import build_tiny_model  # noqa: E402
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes  # noqa: E402
from agentrl.rollout.chat import ChatRenderer  # noqa: E402
from agentrl.rollout.engines.base import SamplingParams  # noqa: E402
from agentrl.rollout.engines.hf import HFEngine  # noqa: E402

TEXTS = ["Count to 42 and then say the last digit of the number.", "Go on.",
         "def add_seven(x):\n    return x + 7", "The capital of France is Paris."] * 50
CALLS = 4
AGENT = '''
import socket
import ssl

import httpx

SSL = ssl.create_default_context()  # made once (each costs ~50 ms), as the gateway's own clients do


async def agent(client, task):
    msgs = [{"role": "user", "content": task["q"]}]
    for k in range(4):
        r = await client.chat.completions.create(model="policy", messages=msgs)
        msgs.append(r.choices[0].message.model_dump(exclude_none=True))
        msgs.append({"role": "user", "content": "Go on."})
    return 1.0


async def agent_http(client, task):
    # the same conversation with plain HTTP (httpx, JSON): the gateway's cost without the SDK's
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    async with httpx.AsyncClient(base_url=str(client.base_url), timeout=3600.0,
                                 headers={"Authorization": f"Bearer {client.api_key}"},
                                 transport=httpx.AsyncHTTPTransport(verify=SSL, socket_options=nodelay)) as http:
        msgs = [{"role": "user", "content": task["q"]}]
        for k in range(4):
            r = await http.post("chat/completions", json={"model": "policy", "messages": msgs})
            r.raise_for_status()
            msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            msgs.append({"role": "user", "content": "Go on."})
    return 1.0
'''


class FourTurns(TextEnv):
    """The agent's conversation as a TextEnv: the task, then "Go on." after each of 4 turns."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.turn = 0
        return [{"role": "user", "content": TEXTS[0]}], {}

    def step(self, action: str):
        self.turn += 1
        done = self.turn == CALLS
        return ([] if done else [{"role": "user", "content": "Go on."}]), (1.0 if done else 0.0), done, False, {}


class Recorder:
    """The engine, passed through; every generate call kept for the replay, and the CPU time
    of the calls on the calling thread (`thread_time`: torch runs there with one thread; the
    agents' and the server's threads, which may work meanwhile, are not counted)."""

    def __init__(self, engine: Any):
        self.engine, self.calls = engine, []
        self.policy_version = 0
        self.gen_cpu = 0.0

    def generate(self, prompts, params):
        c0 = time.thread_time()
        outs = self.engine.generate(prompts, params)
        self.gen_cpu += time.thread_time() - c0
        self.calls.append((prompts, params, [o.token_ids for o in outs]))
        return outs


def gateway_once(env: AgentEnv, engine: Any, renderer: ChatRenderer, runs: int,
                 params: SamplingParams) -> dict[str, Any]:
    """One A/B pair: `runs` agent runs through the gateway, then their generate calls replayed
    on the engine. Wall and process CPU seconds of each (`gw`, `raw`, `gw_cpu`, `raw_cpu`), the
    process CPU outside the generate calls during the runs (`own_cpu`), the trajectories and
    the number of generate calls."""
    rec = Recorder(engine)
    specs = [EpisodeSpec({"seed": 0}, group_id=i) for i in range(runs)]
    server = time.pthread_getcpuclockid(shared_gateway()._thread.ident)  # the server's event loop
    t0, c0, m0, s0 = time.perf_counter(), time.process_time(), time.thread_time(), time.clock_gettime(server)
    trs = env.run_agents(rec, renderer, specs, params, max_episode_tokens=2048, seed=1, timeout_s=600)
    t_gw, c_gw = time.perf_counter() - t0, time.process_time() - c0
    # the gateway's side: the server's thread, and this (driving) thread outside generate
    side = time.clock_gettime(server) - s0 + time.thread_time() - m0 - rec.gen_cpu
    assert len(trs) == runs and all(len(t.turns) == CALLS and "error" not in t.info for t in trs), trs[0].info
    t0, c0 = time.perf_counter(), time.process_time()
    for prompts, p, ids in rec.calls:  # the raw engine: the same calls back to back
        outs = engine.generate(prompts, p)
        assert [o.token_ids for o in outs] == ids, "the replay sampled other tokens"
    t_raw, c_raw = time.perf_counter() - t0, time.process_time() - c0
    return {"gw": t_gw, "raw": t_raw, "gw_cpu": c_gw, "raw_cpu": c_raw, "own_cpu": c_gw - rec.gen_cpu,
            "gateway_cpu": side, "trs": trs, "calls": len(rec.calls)}


def textenv_once(engine: Any, renderer: ChatRenderer, runs: int, params: SamplingParams):
    envs = [FourTurns() for _ in range(runs)]
    t0 = time.perf_counter()
    trs = run_episodes(engine, renderer, envs, [EpisodeSpec({"seed": i}, group_id=i) for i in range(runs)],
                       params, max_episode_tokens=2048, seed=1)
    return time.perf_counter() - t0, trs


def per_call(env: AgentEnv, engine: Any, renderer: ChatRenderer, runs: int, params: SamplingParams,
             repeats: int) -> dict[str, Any]:
    """`repeats` A/B pairs (the agent through the gateway, the same generate calls replayed):
    the overhead's median and range, in wall and process CPU time, and per call."""
    reps = [gateway_once(env, engine, renderer, runs, params) for _ in range(repeats)]
    wall = spread([r["gw"] / r["raw"] - 1 for r in reps])
    cpu = spread([r["gw_cpu"] / r["raw_cpu"] - 1 for r in reps])
    own = spread([r["own_cpu"] / r["raw_cpu"] for r in reps])
    side = spread([r["gateway_cpu"] / r["raw_cpu"] for r in reps])
    ms = spread([1000 * (r["gw"] - r["raw"]) / (runs * CALLS) for r in reps], 3)
    own_ms = spread([1000 * r["own_cpu"] / (runs * CALLS) for r in reps], 3)
    side_ms = spread([1000 * r["gateway_cpu"] / (runs * CALLS) for r in reps], 3)
    call_ms = spread([1000 * r["gw"] / (runs * CALLS) for r in reps], 3)
    print(f"[{env.agent_spec}: per call, {runs} run(s) x {CALLS} calls, {reps[-1]['calls']} generate "
          f"calls] overhead {pct(wall)} wall, {pct(cpu)} process CPU (median [range] of {repeats} "
          f"A/B pairs); CPU outside generate {pct(own)} of the replay's CPU ({own_ms['median']:.2f} "
          f"ms a call), of which the gateway's side {pct(side)} ({side_ms['median']:.3f} ms a call); "
          f"{ms['median']:.2f} ms wall of a "
          f"{call_ms['median']:.1f} ms call")
    return {"agent": env.agent_spec, "generate_calls": reps[-1]["calls"], "overhead": wall,
            "overhead_cpu": cpu, "own_cpu": own, "own_cpu_ms_per_call": own_ms, "gateway_side_cpu": side,
            "gateway_side_ms_per_call": side_ms,
            "overhead_ms_per_call": ms, "call_ms": call_ms,
            "gateway_s_median": round(statistics.median(r["gw"] for r in reps), 4),
            "raw_engine_s_median": round(statistics.median(r["raw"] for r in reps), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-write", action="store_true", help="print only (no results/*.json)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    model_dir = build_tiny_model(tmp / "model", TEXTS)  # the embedded model's default size
    (tmp / "bench_agent.py").write_text(AGENT)
    (tmp / "tasks.jsonl").write_text(json.dumps({"q": TEXTS[0]}) + "\n")
    sys.path.insert(0, str(tmp))
    engine = HFEngine(model_dir)
    renderer = ChatRenderer(engine.tokenizer)
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, stop_token_ids=list(renderer.stop_ids))
    env = AgentEnv("bench_agent:agent", str(tmp / "tasks.jsonl"))
    gateway_once(env, engine, renderer, 2, params)  # warm-up (server start, first calls)
    fast = {m: importlib.util.find_spec(m) is not None for m in ("httptools", "uvloop")}
    out: dict[str, Any] = {**provenance(), "model": "embedded default (hidden 128, 4 layers, vocab 1024)",
                           "server": f"uvicorn {'httptools' if fast['httptools'] else 'h11'}, "
                                     f"{'uvloop' if fast['uvloop'] else 'asyncio'} loop",
                           "max_tokens": args.max_tokens, "calls_per_run": CALLS}
    print(f"load average at start: {out['loadavg']}; server: {out['server']}")
    envs = {"": env, "http_": AgentEnv("bench_agent:agent_http", str(tmp / "tasks.jsonl"))}
    for runs in (1, args.runs):
        for label, e in envs.items():
            out[f"per_call_{label}runs{runs}"] = per_call(e, engine, renderer, runs, params, args.repeats)
    gw = [gateway_once(env, engine, renderer, args.runs, params) for _ in range(args.repeats)]
    te = [textenv_once(engine, renderer, args.runs, params) for _ in range(args.repeats)]
    tok = lambda trs: sum(t.num_sampled for t in trs)  # noqa: E731
    g_best, t_best = min(gw, key=lambda r: r["gw"]), min(te, key=lambda r: r[0])
    out["episodes"] = {
        "runs": args.runs,
        "gateway_samples_per_s": round(args.runs / g_best["gw"], 3),
        "textenv_samples_per_s": round(args.runs / t_best[0], 3),
        "gateway_tokens_per_s": round(tok(g_best["trs"]) / g_best["gw"], 1),
        "textenv_tokens_per_s": round(tok(t_best[1]) / t_best[0], 1)}
    e = out["episodes"]
    print(f"[episodes, {args.runs} x {CALLS} turns] gateway {e['gateway_samples_per_s']:.2f} samples/s "
          f"({e['gateway_tokens_per_s']:.0f} sampled tokens/s), TextEnv {e['textenv_samples_per_s']:.2f} "
          f"samples/s ({e['textenv_tokens_per_s']:.0f} tokens/s)")
    out["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at end: {out['loadavg_end']}")
    if args.no_write:
        return
    dest = Path(__file__).resolve().parent / "results" / "gateway_overhead.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"-> {dest}")


if __name__ == "__main__":
    main()
