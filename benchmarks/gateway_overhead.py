"""What the gateway costs: per call, against the engine called directly, and per episode, a
4-call agent through the gateway against the same episode as a `TextEnv`.

    python benchmarks/gateway_overhead.py            # the embedded model's default size
    python benchmarks/gateway_overhead.py --runs 16 --repeats 3

1. Per call: B agent runs (`--runs`; and B=1, calls one after another) make 4 calls each through
   the real `openai` SDK and the real server on 127.0.0.1 (`AgentEnv.run_agents`, the training
   path: rendering with prefix reuse, batching, recording). A pass-through recorder keeps every
   `engine.generate` call (prompts, params); "raw" replays the same calls on the same engine back
   to back (same prompts, params and seeds: the same tokens, checked). overhead = t_gateway /
   t_raw - 1, in wall time and in process CPU time (steadier on a shared machine), the median
   of `--repeats` runs (target < 5 % on the embedded model).
2. Per episode: the same 4-turn conversation (user, reply, "Go on.", ...) as a `TextEnv` through
   the agent loop (`run_episodes`) and as an agent through the gateway: samples (episodes) per
   second and sampled tokens per second, best of `--repeats`.
Writes benchmarks/results/gateway_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from agentrl.env.base import TextEnv  # noqa: E402
from agentrl.gateway.agents import AgentEnv  # noqa: E402
from agentrl.models.tiny import build_tiny_model  # noqa: E402
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes  # noqa: E402
from agentrl.rollout.chat import ChatRenderer  # noqa: E402
from agentrl.rollout.engines.base import SamplingParams  # noqa: E402
from agentrl.rollout.engines.hf import HFEngine  # noqa: E402

TEXTS = ["Count to 42 and then say the last digit of the number.", "Go on.",
         "def add_seven(x):\n    return x + 7", "The capital of France is Paris."] * 50
CALLS = 4
AGENT = '''
async def agent(client, task):
    msgs = [{"role": "user", "content": task["q"]}]
    for k in range(4):
        r = await client.chat.completions.create(model="policy", messages=msgs)
        msgs.append(r.choices[0].message.model_dump(exclude_none=True))
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
    """The engine, passed through; every generate call kept for the replay."""

    def __init__(self, engine: Any):
        self.engine, self.calls = engine, []
        self.policy_version = 0

    def generate(self, prompts, params):
        outs = self.engine.generate(prompts, params)
        self.calls.append((prompts, params, [o.token_ids for o in outs]))
        return outs


def gateway_once(env: AgentEnv, engine: Any, renderer: ChatRenderer, runs: int, params: SamplingParams):
    rec = Recorder(engine)
    specs = [EpisodeSpec({"seed": 0}, group_id=i) for i in range(runs)]
    t0, c0 = time.perf_counter(), time.process_time()
    trs = env.run_agents(rec, renderer, specs, params, max_episode_tokens=2048, seed=1, timeout_s=600)
    t_gw, c_gw = time.perf_counter() - t0, time.process_time() - c0
    assert len(trs) == runs and all(len(t.turns) == CALLS and "error" not in t.info for t in trs), trs[0].info
    t0, c0 = time.perf_counter(), time.process_time()
    for prompts, p, ids in rec.calls:  # the raw engine: the same calls back to back
        outs = engine.generate(prompts, p)
        assert [o.token_ids for o in outs] == ids, "the replay sampled other tokens"
    t_raw, c_raw = time.perf_counter() - t0, time.process_time() - c0
    return t_gw, t_raw, trs, len(rec.calls), c_gw, c_raw


def textenv_once(engine: Any, renderer: ChatRenderer, runs: int, params: SamplingParams):
    envs = [FourTurns() for _ in range(runs)]
    t0 = time.perf_counter()
    trs = run_episodes(engine, renderer, envs, [EpisodeSpec({"seed": i}, group_id=i) for i in range(runs)],
                       params, max_episode_tokens=2048, seed=1)
    return time.perf_counter() - t0, trs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
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
    out: dict[str, Any] = {"model": "embedded default (hidden 128, 4 layers, vocab 1024)",
                           "max_tokens": args.max_tokens, "calls_per_run": CALLS}
    for runs in (1, args.runs):
        reps = sorted((gateway_once(env, engine, renderer, runs, params) for _ in range(args.repeats)),
                      key=lambda r: r[4] / r[5])
        t_gw, t_raw, trs, n_calls, c_gw, c_raw = reps[len(reps) // 2]  # the median by CPU ratio
        out[f"per_call_runs{runs}"] = {
            "generate_calls": n_calls, "gateway_s": round(t_gw, 4), "raw_engine_s": round(t_raw, 4),
            "overhead": round(t_gw / t_raw - 1, 4), "overhead_cpu": round(c_gw / c_raw - 1, 4),
            "overhead_ms_per_call": round(1000 * (t_gw - t_raw) / (runs * CALLS), 3),
            "call_ms": round(1000 * t_gw / (runs * CALLS), 3)}
        print(f"[per call, {runs} run(s) x {CALLS} calls] gateway {t_gw:.3f} s, engine directly "
              f"{t_raw:.3f} s: overhead {100 * (t_gw / t_raw - 1):+.1f}% "
              f"({1000 * (t_gw - t_raw) / (runs * CALLS):.2f} ms of a {1000 * t_gw / (runs * CALLS):.1f} ms call); "
              f"process CPU time {c_gw:.3f} s vs {c_raw:.3f} s: {100 * (c_gw / c_raw - 1):+.1f}%")
    gw = [gateway_once(env, engine, renderer, args.runs, params) for _ in range(args.repeats)]
    te = [textenv_once(engine, renderer, args.runs, params) for _ in range(args.repeats)]
    tok = lambda trs: sum(t.num_sampled for t in trs)  # noqa: E731
    g_best, t_best = min(gw, key=lambda r: r[0]), min(te, key=lambda r: r[0])
    out["episodes"] = {
        "runs": args.runs,
        "gateway_samples_per_s": round(args.runs / g_best[0], 3),
        "textenv_samples_per_s": round(args.runs / t_best[0], 3),
        "gateway_tokens_per_s": round(tok(g_best[2]) / g_best[0], 1),
        "textenv_tokens_per_s": round(tok(t_best[1]) / t_best[0], 1)}
    e = out["episodes"]
    print(f"[episodes, {args.runs} x {CALLS} turns] gateway {e['gateway_samples_per_s']:.2f} samples/s "
          f"({e['gateway_tokens_per_s']:.0f} sampled tokens/s), TextEnv {e['textenv_samples_per_s']:.2f} "
          f"samples/s ({e['textenv_tokens_per_s']:.0f} tokens/s)")
    dest = Path(__file__).resolve().parent / "results" / "gateway_overhead.json"
    dest.write_text(json.dumps(out, indent=1) + "\n")
    print(f"-> {dest}")


if __name__ == "__main__":
    main()
