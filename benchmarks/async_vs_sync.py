"""Samples per second of the synchronous loop vs the asynchronous actor-learner, in one run.

A rollout-bound configuration: the embedded tiny model sampling longer completions, and an env
whose step waits `--latency` seconds (an I/O-bound judge or tool call). Both modes run the same
number of steps on the same seed; the script prints samples/s of each and the ratio.

    python benchmarks/async_vs_sync.py [--steps 8] [--latency 0.5] [--tokens 48]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def run(mode: str, out: Path, args: argparse.Namespace) -> dict:
    from agentrl.config import load_config
    from agentrl.train import train

    ov = [f"out={out}", "env.name=latency_env:LatencyEnv", f"env.kwargs.latency_s={args.latency}",
          f"train.steps={args.steps}", "sft.steps=0", "rollout.tasks_per_step=4", "algo.group_size=4",
          f"rollout.max_tokens={args.tokens}", "train.eval_tasks=2", "train.eval_samples=1",
          "train.log_rollouts_every=0", "quiet=true", f"rollout.mode={mode}", "train.max_staleness=1",
          "rollout.env_threads=16"]
    t0 = time.perf_counter()
    train(load_config(None, ov))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_s" in r][1:]  # the first step warms up
    wall = sum(r["perf/rollout_s"] + r["perf/update_s"] + r["perf/sync_s"] for r in steps)
    samples = 16 * len(steps)
    return {"mode": mode, "samples_per_s": samples / wall, "step_s": wall / len(steps),
            "learner_idle_s": sum(r.get("perf/learner_idle_s", 0) for r in steps) / len(steps),
            "total_s": time.perf_counter() - t0}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--latency", type=float, default=0.5)
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        res = [run(m, Path(d) / m, args) for m in ("sync", "async")]
    for r in res:
        print(f"{r['mode']:6s} {r['samples_per_s']:7.2f} samples/s  {r['step_s']:6.2f} s/step  "
              f"learner idle {r['learner_idle_s']:.2f} s/step")
    print(f"async/sync samples-per-second ratio: {res[1]['samples_per_s'] / res[0]['samples_per_s']:.2f}x")


if __name__ == "__main__":
    main()
