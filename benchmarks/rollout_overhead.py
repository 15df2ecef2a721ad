"""Overhead of the agent loop over raw engine generation, and the time of a weight sync.

    python benchmarks/rollout_overhead.py                  # HF engine, + 2 Ray workers
    python benchmarks/rollout_overhead.py --workers 0      # no Ray
    python benchmarks/rollout_overhead.py --engine vllm    # in a venv with vllm(-cpu)

1. The agent loop (`run_episodes`) runs E multi-turn episodes on a cheap env; a pass-through
   recorder keeps every `engine.generate` call it makes (prompts and params).
2. "Raw": the same calls are replayed on the same engine, back to back. Same prompts, params and
   seeds give the same tokens, so both do exactly the same generation work (checked).
3. overhead = t_loop / t_raw - 1: what rendering, env steps, bookkeeping and batching cost on
   top of generation (target <= 5 %), in process CPU time (robust on a shared machine) and in
   wall time, each the best of `--repeats` runs; and the loop's own work: its wall time outside
   `engine.generate`, per episode-turn.
4. Weight sync: `engine.update_weights` in process, and with `--workers N` a `RolloutPool` push
   (one `ray.put`, N parallel loads) plus the pool's loop throughput.
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from agentrl.env.base import TextEnv  # noqa: E402
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes  # noqa: E402
from agentrl.rollout.chat import ChatRenderer  # noqa: E402
from agentrl.rollout.engines.base import SamplingParams  # noqa: E402

TEXTS = ["Count to 42 and then say the last digit of the number.",
         "Now the last digit. Answer with one digit only.",
         "def add_seven(x):\n    return x + 7", "The capital of France is Paris."] * 50


class CountEnv(TextEnv):
    """`turns` agent turns per episode on a task drawn from the seed; constant-time steps."""

    def __init__(self, turns: int = 3):
        self.turns = turns

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n, self.t = int(self.np_random.integers(10, 100)), 0
        return [{"role": "user", "content": f"Count to {self.n}."}], {"task_id": str(self.n)}

    def step(self, action):
        self.t += 1
        done = self.t >= self.turns
        obs = [] if done else [{"role": "user", "content": "Now the last digit."}]
        return obs, float(str(self.n % 10) in action), done, False, {}


@dataclass
class Recorder:
    """Pass-through engine wrapper that records each `generate` call and its duration."""

    engine: Any
    calls: list[tuple[list[list[int]], SamplingParams]] = field(default_factory=list)
    gen_s: float = 0.0

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params))
        t0 = time.perf_counter()
        out = self.engine.generate(prompts, params)
        self.gen_s += time.perf_counter() - t0
        return out


def build_engine(kind: str, model_dir: str, threads: int) -> Any:
    if kind == "vllm":
        from agentrl.rollout.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir, dtype="float32", kv_cache_memory_bytes=1 << 30)
    from agentrl.rollout.engines.hf import HFEngine

    return HFEngine(model_dir, torch_threads=threads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="Ray workers for the pool figures (0: skip)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each engine")
    args = ap.parse_args()

    import torch

    from agentrl.models.tiny import build_tiny_model, load_model

    torch.set_num_threads(args.threads)
    tmp = tempfile.mkdtemp(prefix="rollout_bench_")
    model_dir = build_tiny_model(f"{tmp}/model", TEXTS, hidden_size=args.hidden,
                                 num_layers=args.layers, num_heads=4, intermediate_size=3 * args.hidden,
                                 vocab_size=1024, seed=0)
    engine = build_engine(args.engine, model_dir, args.threads)
    tokenizer = load_model(model_dir)[1]
    renderer = ChatRenderer(tokenizer)
    params = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, stop_token_ids=renderer.stop_ids)
    specs = [EpisodeSpec({"seed": i // 8}, group_id=i // 8) for i in range(args.episodes)]
    envs = [CountEnv(args.turns) for _ in specs]
    n_params = sum(p.numel() for p in load_model(model_dir)[0].parameters())
    print(f"engine={args.engine} model: {n_params / 1e6:.2f} M params (hidden {args.hidden}, "
          f"{args.layers} layers); {args.episodes} episodes x {args.turns} turns, "
          f"max_tokens {args.max_tokens}, torch threads {args.threads}")

    run_episodes(engine, renderer, envs, specs, params, seed=0)  # warm-up
    wall = {"loop": [], "raw": [], "own": []}
    cpu = {"loop": [], "raw": []}  # process CPU seconds: robust to other users of the machine
    tokens = 0
    for r in range(args.repeats):
        rec = Recorder(engine)
        t0, c0 = time.perf_counter(), time.process_time()
        trajs = run_episodes(rec, renderer, envs, specs, params, seed=100 + r)
        wall["loop"].append(time.perf_counter() - t0)
        cpu["loop"].append(time.process_time() - c0)
        wall["own"].append(wall["loop"][-1] - rec.gen_s)
        tokens = sum(t.num_sampled for t in trajs)
        t0, c0 = time.perf_counter(), time.process_time()
        replay = [engine.generate(p, sp) for p, sp in rec.calls]
        wall["raw"].append(time.perf_counter() - t0)
        cpu["raw"].append(time.process_time() - c0)
        replay_tokens = sum(len(c.token_ids) for out in replay for c in out)
        if replay_tokens < tokens:  # the loop cuts a row only at max_episode_tokens
            raise SystemExit(f"replay generated {replay_tokens} tokens < loop's {tokens}")
    loop_s, raw_s, own_s = min(wall["loop"]), min(wall["raw"]), min(wall["own"])
    loop_c, raw_c = min(cpu["loop"]), min(cpu["raw"])
    print(f"raw engine.generate : {tokens / raw_s:8.0f} tokens/s  ({raw_s:.3f} s wall, "
          f"{raw_c:.3f} s CPU, {len(rec.calls)} calls)")
    print(f"agent loop          : {tokens / loop_s:8.0f} tokens/s  ({loop_s:.3f} s wall, "
          f"{loop_c:.3f} s CPU)")
    print(f"loop overhead       : {100 * (loop_c / raw_c - 1):+.1f} % CPU time, "
          f"{100 * (loop_s / raw_s - 1):+.1f} % wall time (target <= 5 %)")
    print(f"loop's own work     : {own_s:.3f} s wall outside engine.generate = "
          f"{100 * own_s / raw_s:.1f} % of raw, {1000 * own_s / (args.episodes * args.turns):.2f} ms "
          f"per episode-turn (best of {args.repeats}; wall figures vary with the machine's load)")

    sd = {k: v * 1.0 for k, v in load_model(model_dir)[0].state_dict().items()}
    t0 = time.perf_counter()
    engine.update_weights(sd, 1)
    print(f"weight sync, in process: {1000 * (time.perf_counter() - t0):.1f} ms "
          f"({sum(v.numel() * v.element_size() for v in sd.values()) / 2**20:.1f} MiB state dict)")

    if args.workers > 0:
        from agentrl.config import Config
        from agentrl.rollout.workers import RolloutPool, ensure_ray

        cfg = Config.model_validate({"rollout": {
            "engine": args.engine, "num_workers": args.workers, "torch_threads": args.threads,
            "max_tokens": args.max_tokens, "max_episode_tokens": 1024}})
        t0 = time.perf_counter()
        ensure_ray(None, num_cpus=max(2, args.workers))
        # defined in __main__, so cloudpickle sends the function and CountEnv by value
        pool = RolloutPool(cfg, model_dir, env_factory=functools.partial(make_count_env, args.turns))
        print(f"ray + {args.workers} workers up: {time.perf_counter() - t0:.1f} s")
        pool.run(specs, params, seed=0)  # warm-up
        best_pool = float("inf")
        for r in range(args.repeats):
            t0 = time.perf_counter()
            trajs = pool.run(specs, params, seed=100 + r)
            best_pool = min(best_pool, time.perf_counter() - t0)
        pool_tokens = sum(t.num_sampled for t in trajs)
        print(f"pool of {args.workers} workers : {pool_tokens / best_pool:8.0f} tokens/s  "
              f"({best_pool:.3f} s)")
        syncs = []
        for v in range(2, 2 + args.repeats):
            syncs.append(pool.update_weights(sd, v))
        print(f"weight sync, {args.workers} Ray workers: best {1000 * min(syncs):.1f} ms, "
              f"last {1000 * syncs[-1]:.1f} ms (put {1000 * pool.stats['put_s']:.1f} ms, "
              f"slowest load {1000 * pool.stats['load_s_max']:.1f} ms)")
        pool.shutdown()


def make_count_env(turns: int, split: str) -> CountEnv:
    """`CountEnv(turns)` for any split (the pool's `env_factory` signature)."""
    return CountEnv(turns)


if __name__ == "__main__":
    main()
