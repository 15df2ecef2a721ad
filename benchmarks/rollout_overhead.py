"""Overhead of the agent loop over raw engine generation, in process and on a Ray rollout
worker, and the time of a weight sync.

    python benchmarks/rollout_overhead.py                  # HF engine; + 1 Ray worker
    python benchmarks/rollout_overhead.py --workers 0      # no Ray
    python benchmarks/rollout_overhead.py --engine vllm    # in a venv with vllm(-cpu)

1. The agent loop (`run_episodes`) runs E multi-turn episodes on a cheap env; a pass-through
   recorder keeps every `engine.generate` call it makes (prompts and params).
2. "Raw": the same calls are replayed on the same engine, back to back. Same prompts, params and
   seeds give the same tokens, so both do exactly the same generation work (checked).
3. overhead = t_loop / t_raw - 1: what rendering, env steps, bookkeeping and batching cost on
   top of generation (target <= 5 %), in process CPU time (steadier on a shared machine) and in
   wall time. Loop and replay alternate (A B A B ...) `--repeats` times; each pair gives one
   ratio, reported as the median and range; and the loop's own work: its wall time outside
   `engine.generate`, per episode-turn, and its process CPU time outside `engine.generate`
   as a share of the replay's (insensitive to the noise of the generation itself).
4. The Ray-worker path (`--workers N`, N >= 1): a `RolloutPool` of N workers, each recording
   its engine's generate calls; "raw" replays each worker's calls on that worker's engine (the
   workers in parallel). overhead = the driver's wall time of `pool.run` (Ray calls, shipping
   the trajectories back included) / the slowest worker's replay - 1; in CPU time, the workers'
   process CPU during `pool.run` plus the driver's / the workers' CPU in the replay - 1; and
   that CPU outside the generate calls (Ray's threads in the worker included) / the replay's.
5. Weight sync: `engine.update_weights` in process, and with workers a `RolloutPool` push (one
   `ray.put`, N parallel loads).
Writes benchmarks/results/rollout_overhead.json (`rollout_overhead_vllm.json` with vLLM), with
the commit, the command and the load averages.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from overhead_common import pct, provenance, spread  # noqa: E402

from agentrl.env.base import TextEnv  # noqa: E402
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes  # noqa: E402
from agentrl.rollout.chat import ChatRenderer  # noqa: E402
from agentrl.rollout.engines.base import SamplingParams  # noqa: E402
from agentrl.rollout.workers import RolloutWorker  # noqa: E402

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
    gen_cpu: float = 0.0

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def generate(self, prompts, params):
        self.calls.append(([list(p) for p in prompts], params))
        t0, c0 = time.perf_counter(), time.thread_time()  # torch runs on this thread (1 thread)
        out = self.engine.generate(prompts, params)
        self.gen_s += time.perf_counter() - t0
        self.gen_cpu += time.thread_time() - c0
        return out

    def update_weights(self, state_dict, version):
        return self.engine.update_weights(state_dict, version)


def replay(engine: Any, calls: list[tuple[list[list[int]], SamplingParams]]) -> dict[str, float]:
    """The recorded `calls` on `engine`, back to back: wall and process CPU seconds, tokens."""
    t0, c0 = time.perf_counter(), time.process_time()
    outs = [engine.generate(p, sp) for p, sp in calls]
    return {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
            "tokens": sum(len(c.token_ids) for out in outs for c in out)}


class BenchWorker(RolloutWorker):
    """A `RolloutWorker` whose engine records its generate calls (cleared at each `run`), and
    can replay them (`replay_last`) and report its process CPU time (`cpu`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine = Recorder(self.engine)

    def run(self, *args: Any, **kwargs: Any):
        self.engine.calls.clear()
        self.engine.gen_cpu = 0.0
        return super().run(*args, **kwargs)

    def cpu(self) -> float:
        return time.process_time()

    def replay_last(self) -> dict[str, float]:
        return {**replay(self.engine.engine, self.engine.calls), "gen_cpu": self.engine.gen_cpu}


def build_engine(kind: str, model_dir: str, threads: int) -> Any:
    if kind == "vllm":
        from agentrl.rollout.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir, dtype="float32", kv_cache_memory_bytes=1 << 30)
    from agentrl.rollout.engines.hf import HFEngine

    return HFEngine(model_dir, torch_threads=threads)


def in_process(engine: Any, renderer: ChatRenderer, envs: list, specs: list, params: SamplingParams,
               repeats: int) -> dict[str, Any]:
    """Loop and replay alternated `repeats` times on the in-process engine (module doc, 1-3)."""
    cpu, wall, own, own_cpu, tokens, calls = [], [], [], [], 0, 0
    loop_s, raw_s = [], []
    for r in range(repeats):
        rec = Recorder(engine)
        t0, c0 = time.perf_counter(), time.process_time()
        trajs = run_episodes(rec, renderer, envs, specs, params, seed=100 + r)
        t_loop, c_loop = time.perf_counter() - t0, time.process_time() - c0
        tokens, calls = sum(t.num_sampled for t in trajs), len(rec.calls)
        raw = replay(engine, rec.calls)
        if raw["tokens"] < tokens:  # the loop cuts a row only at max_episode_tokens
            raise SystemExit(f"replay generated {raw['tokens']} tokens < loop's {tokens}")
        cpu.append(c_loop / raw["cpu"] - 1)
        wall.append(t_loop / raw["wall"] - 1)
        own.append((t_loop - rec.gen_s) / raw["wall"])
        own_cpu.append((c_loop - rec.gen_cpu) / raw["cpu"])
        loop_s.append(t_loop)
        raw_s.append(raw["wall"])
    per_turn = [o * r / (len(specs) * envs[0].turns) * 1000 for o, r in zip(own, raw_s)]
    return {"overhead_cpu": spread(cpu), "overhead_wall": spread(wall), "own_work": spread(own),
            "own_work_cpu": spread(own_cpu),
            "own_ms_per_episode_turn": spread(per_turn, 3), "sampled_tokens": tokens,
            "generate_calls": calls, "loop_tokens_per_s": round(tokens / min(loop_s)),
            "raw_tokens_per_s": round(tokens / min(raw_s))}


def ray_path(args: argparse.Namespace, model_dir: str, specs: list, params: SamplingParams) -> dict[str, Any]:
    """The same episodes through a `RolloutPool` of `args.workers` Ray workers, alternated with
    the replay of each worker's generate calls on its own engine (module doc, 4-5)."""
    import ray

    from agentrl.config import Config
    from agentrl.rollout.workers import RolloutPool, ensure_ray

    cfg = Config.model_validate({"rollout": {
        "engine": args.engine, "num_workers": args.workers, "torch_threads": args.threads,
        "max_tokens": args.max_tokens, "max_episode_tokens": 1024}})
    t0 = time.perf_counter()
    ensure_ray(None, num_cpus=max(2, args.workers))
    # defined in __main__, so cloudpickle sends the function, CountEnv and BenchWorker by value
    pool = RolloutPool(cfg, model_dir, env_factory=functools.partial(make_count_env, args.turns),
                       worker_cls=BenchWorker)
    up_s = time.perf_counter() - t0
    pool.run(specs, params, seed=0)  # warm-up
    cpu, wall, own, tokens = [], [], [], 0
    for r in range(args.repeats):
        w0 = ray.get([w.cpu.remote() for w in pool.workers])
        t0, c0 = time.perf_counter(), time.process_time()
        trajs = pool.run(specs, params, seed=100 + r)
        t_run, c_drv = time.perf_counter() - t0, time.process_time() - c0
        c_run = sum(ray.get([w.cpu.remote() for w in pool.workers])) - sum(w0) + c_drv
        raws = ray.get([w.replay_last.remote() for w in pool.workers])
        tokens = sum(t.num_sampled for t in trajs)
        if sum(x["tokens"] for x in raws) < tokens:
            raise SystemExit("the workers' replay generated fewer tokens than their loop")
        cpu.append(c_run / sum(x["cpu"] for x in raws) - 1)
        own.append((c_run - sum(x["gen_cpu"] for x in raws)) / sum(x["cpu"] for x in raws))
        wall.append(t_run / max(x["wall"] for x in raws) - 1)
    sd = {k: v * 1.0 for k, v in load_model_sd(model_dir).items()}
    syncs = [pool.update_weights(sd, v) for v in range(2, 2 + args.repeats)]
    out = {"workers": args.workers, "start_s": round(up_s, 1), "overhead_cpu": spread(cpu),
           "own_work_cpu": spread(own),
           "overhead_wall": spread(wall), "sampled_tokens": tokens,
           "sync_ms_best": round(1000 * min(syncs), 1), "sync_put_ms": round(1000 * pool.stats["put_s"], 1),
           "sync_load_ms_max": round(1000 * pool.stats["load_s_max"], 1)}
    pool.shutdown()
    return out


def load_model_sd(model_dir: str) -> dict[str, Any]:
    from agentrl.models.tiny import load_model

    return load_model(model_dir)[0].state_dict()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7, help="A/B pairs (loop, replay) per figure")
    ap.add_argument("--workers", type=int, default=1, help="Ray workers for the pool figures (0: skip)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each engine")
    ap.add_argument("--no-write", action="store_true", help="print only (no results/*.json)")
    args = ap.parse_args()

    import torch

    from agentrl.models.tiny import build_tiny_model, load_model

    prov = provenance()
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
    setup = (f"engine={args.engine} model: {n_params / 1e6:.2f} M params (hidden {args.hidden}, "
             f"{args.layers} layers); {args.episodes} episodes x {args.turns} turns, "
             f"max_tokens {args.max_tokens}, torch threads {args.threads}")
    print(setup)
    print(f"load average at start: {prov['loadavg']}")
    run_episodes(engine, renderer, envs, specs, params, seed=0)  # warm-up
    res: dict[str, Any] = {**prov, "setup": setup, "in_process": in_process(
        engine, renderer, envs, specs, params, args.repeats)}
    ip = res["in_process"]
    print(f"raw engine.generate : {ip['raw_tokens_per_s']:8d} tokens/s (best), {ip['generate_calls']} calls")
    print(f"agent loop          : {ip['loop_tokens_per_s']:8d} tokens/s (best)")
    print(f"loop overhead       : {pct(ip['overhead_cpu'])} CPU time, {pct(ip['overhead_wall'])} wall "
          f"time (median [range] of {args.repeats} A/B pairs; target <= 5 %)")
    print(f"loop's own work     : {100 * ip['own_work']['median']:.1f} % of raw wall, "
          f"{pct(ip['own_work_cpu'])} of raw CPU outside engine.generate "
          f"({ip['own_ms_per_episode_turn']['median']:.2f} ms wall per episode-turn, median)")
    sd = {k: v * 1.0 for k, v in load_model(model_dir)[0].state_dict().items()}
    t0 = time.perf_counter()
    engine.update_weights(sd, 1)
    res["sync_in_process_ms"] = round(1000 * (time.perf_counter() - t0), 1)
    print(f"weight sync, in process: {res['sync_in_process_ms']:.1f} ms "
          f"({sum(v.numel() * v.element_size() for v in sd.values()) / 2**20:.1f} MiB state dict)")
    if args.workers > 0:
        rp = res["ray"] = ray_path(args, model_dir, specs, params)
        print(f"ray + {args.workers} worker(s) up: {rp['start_s']:.1f} s")
        print(f"Ray-worker path     : {pct(rp['overhead_wall'])} wall time, {pct(rp['overhead_cpu'])} "
              f"CPU time (workers + driver) vs the same calls on the workers' engines (target <= 5 %); "
              f"CPU outside generate {pct(rp['own_work_cpu'])} of the replay's")
        print(f"weight sync, {args.workers} Ray worker(s): best {rp['sync_ms_best']:.1f} ms (put "
              f"{rp['sync_put_ms']:.1f} ms, slowest load {rp['sync_load_ms_max']:.1f} ms)")
    res["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at end: {res['loadavg_end']}")
    if not args.no_write:
        name = "rollout_overhead.json" if args.engine == "hf" else f"rollout_overhead_{args.engine}.json"
        dest = Path(__file__).resolve().parent / "results" / name
        dest.write_text(json.dumps(res, indent=1) + "\n")
        print(f"-> {dest}")


def make_count_env(turns: int, split: str) -> CountEnv:
    """`CountEnv(turns)` for any split (the pool's `env_factory` signature)."""
    return CountEnv(turns)


if __name__ == "__main__":
    main()
