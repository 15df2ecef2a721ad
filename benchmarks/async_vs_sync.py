"""Samples per second of the synchronous loop vs the asynchronous actor-learner, in one run.

A rollout-bound configuration: the embedded tiny model (the main job's) sampling up to
`--tokens` tokens per turn, and a multi-turn env whose every step waits `--latency` seconds (an
I/O-bound judge, tool or sandbox call; `latency_env.LatencyEnv`), 16 episodes per step stepped by
16 env threads. Every mode runs the same `--steps` steps on the same seed and the same model;
what is measured is wall clock: the whole RL loop (`rl_s` of the run summary: from the first
batch's sampling to the last update, pipeline fill and drain included), not a sum of per-stage
times (in async mode the stages overlap). Also printed: steady-state samples/s from the end of
step 1 to the end of the last step (`perf/loop_s`).

Modes: `sync`; `async` with one batch in flight (the single-actor design: only the learner's
update is hidden); `async` with 2 batches in flight and `train.max_staleness=2` (while batch s's
episodes wait on the env, batch s+1's generate; K=2 lets both sample while the learner trains);
`async-2p`: the same with partial rollouts (`rollout.partial=true`: a push lands inside the
running generation).

Time to accuracy (`--tta`, issue 43; AReaL and verl report this rather than samples/s): every
mode also evaluates on the held-out split every `--eval-every` steps (`--eval-tasks` tasks x 1
sample), and for each mode the script reports the training wall time (`perf/loop_s`, the
evaluations' own seconds taken out) at which its held-out `--tta-metric` first reaches the sync
run's final value, and that time over sync's. The metric defaults to `reward_mean`: this env's
reward is the fraction of 'a' characters, so pass@1 (a return of 1) is 0 for every run.

    python benchmarks/async_vs_sync.py [--steps 12] [--latency 0.5] [--turns 3] [--tokens 48] [--rounds 1]
    python benchmarks/async_vs_sync.py --tta --modes sync,async-2,async-2p --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

BATCH = 16  # rollout.tasks_per_step=4 x algo.group_size=4
MODES = {  # name -> overrides
    "sync": ["rollout.mode=sync"],
    "async-1": ["rollout.mode=async", "train.max_staleness=2", "rollout.batches_in_flight=1"],
    "async-2": ["rollout.mode=async", "train.max_staleness=2", "rollout.batches_in_flight=2"],
    "async-3": ["rollout.mode=async", "train.max_staleness=3", "rollout.batches_in_flight=3"],
    "async-2p": ["rollout.mode=async", "train.max_staleness=2", "rollout.batches_in_flight=2",
                 "rollout.partial=true"],
}


def accuracy_curve(rows: list[dict], after: dict, metric: str) -> list[tuple[float, float]]:
    """(training seconds, held-out `metric`) after each evaluation of a run: the evaluation
    before RL at 0 s, then `perf/loop_s` at each evaluated step minus the seconds of the
    evaluations before it, then the final evaluation (`after`) at the last step's time."""
    out, evals = [], 0.0
    for r in rows:
        if "perf/loop_s" not in r:
            if r.get("step") == 0 and f"eval/{metric}" in r:
                out.append((0.0, r[f"eval/{metric}"]))
            continue
        t = r["perf/loop_s"] - evals
        if f"eval/{metric}" in r:
            out.append((t, r[f"eval/{metric}"]))
            evals += r.get("eval/seconds", 0.0)
        last = t
    out.append((last, after[metric]))
    return out


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first training time at which `curve` reaches `target` (None: never)."""
    return next((t for t, v in curve if v >= target - 1e-12), None)


def run(mode: str, out: Path, model: str | None, args: argparse.Namespace) -> dict:
    from agentrl.config import load_config
    from agentrl.train import train

    ov = [f"out={out}", "env.name=latency_env:LatencyEnv", f"env.kwargs.latency_s={args.latency}",
          f"env.kwargs.turns={args.turns}", f"train.steps={args.steps}", "sft.steps=0",
          "rollout.tasks_per_step=4", "algo.group_size=4", f"rollout.max_tokens={args.tokens}",
          "train.eval_tasks=2", "train.eval_samples=1", "train.log_rollouts_every=0", "quiet=true",
          "rollout.env_threads=16", "log.tensorboard=false", *MODES[mode]]
    if args.tta:
        ov[ov.index("train.eval_tasks=2")] = f"train.eval_tasks={args.eval_tasks}"
        ov.append(f"train.eval_every={args.eval_every}")
    if model is not None:
        ov.append(f"model.path={model}")
    summary = train(load_config(None, ov))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/loop_s" in r]
    steady = (steps[-1]["perf/loop_s"] - steps[0]["perf/loop_s"]) / (len(steps) - 1)
    n = len(steps)
    return {"mode": mode, "samples_per_s": BATCH * n / summary["rl_s"], "rl_s": summary["rl_s"],
            "steady_samples_per_s": BATCH / steady,
            "update_s": sum(r["perf/update_s"] for r in steps) / n,
            "gen_s": sum(r["perf/rollout_s"] - r["perf/env_s"] for r in steps) / n
            if mode == "sync" else None,
            "learner_idle_s": sum(r.get("perf/learner_idle_s", 0) for r in steps) / n,
            "staleness_max": max(r["rollout/staleness_max"] for r in steps),
            "in_flight": sum(r.get("async/batches_in_flight", 0) for r in steps) / n,
            "reward": sum(r["rollout/reward_mean"] for r in steps) / n,
            "turns": steps[-1]["rollout/turns"],
            "staleness_tokens_mean": sum(r.get("rollout/staleness_tokens_mean", 0) for r in steps) / n,
            "curve": accuracy_curve(rows, {**summary["eval_after"], "reward_mean": summary["eval_after"].get(
                "reward_mean", summary["eval_after"].get("pass@1"))}, args.tta_metric)
            if args.tta else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--latency", type=float, default=0.5, help="seconds per env step")
    p.add_argument("--turns", type=int, default=3, help="agent turns per episode")
    p.add_argument("--tokens", type=int, default=48, help="rollout.max_tokens (per turn)")
    p.add_argument("--modes", default="sync,async-1,async-2,async-3")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every mode this many times, the order reversed every other round; "
                        "the median samples/s per mode is reported (load on shared cores drifts)")
    p.add_argument("--tta", action="store_true", help="also report time to accuracy (see module doc)")
    p.add_argument("--eval-every", type=int, default=3)
    p.add_argument("--eval-tasks", type=int, default=16)
    p.add_argument("--tta-metric", default="reward_mean", help="held-out metric: reward_mean or pass@1")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    modes = args.modes.split(",")
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}; {args.steps} steps x {BATCH} episodes x {args.turns} turns, "
          f"env latency {args.latency} s/step, max {args.tokens} tokens/turn", flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d:
        model = None
        for k in range(args.rounds):
            for m in (modes if k % 2 == 0 else modes[::-1]):
                t0 = time.perf_counter()
                r = run(m, Path(d) / f"{m}-{k}", model, args)
                model = model or str(Path(d) / f"{m}-{k}" / "base_model")  # one model for all runs
                runs[m].append(r)
                print(f"  (round {k + 1}: {m} {r['samples_per_s']:.2f} samples/s, done in "
                      f"{time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.2f})", flush=True)
    res = [sorted(runs[m], key=lambda r: r["samples_per_s"])[(len(runs[m]) - 1) // 2] for m in modes]
    if args.rounds > 1:
        print(f"median of {args.rounds} rounds per mode (lower median):")
    base = res[0]["samples_per_s"]
    for r in res:
        gen = f"  generate+sample {r['gen_s']:.2f} s/step" if r["gen_s"] is not None else ""
        print(f"{r['mode']:8s} {r['samples_per_s']:6.2f} samples/s ({r['rl_s']:5.1f} s loop; steady "
              f"{r['steady_samples_per_s']:6.2f})  x{r['samples_per_s'] / base:.2f}  update "
              f"{r['update_s']:.2f} s/step  learner idle {r['learner_idle_s']:.2f} s/step  in flight "
              f"{r['in_flight']:.1f}  staleness max {r['staleness_max']:.0f}  reward {r['reward']:.3f}"
              + gen)
    by = {r["mode"]: r for r in res}
    if "sync" in by:
        for m in modes[1:]:
            print(f"{m}/sync samples-per-second ratio: "
                  f"{by[m]['samples_per_s'] / by['sync']['samples_per_s']:.2f}x")
    if args.tta and "sync" in by:
        report_tta(by, modes, args.tta_metric)
    print(f"load average at end: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f}")


def report_tta(by: dict[str, dict], modes: list[str], metric: str) -> None:
    """Print each mode's held-out curve and its time to sync's final held-out `metric`."""
    target = by["sync"]["curve"][-1][1]
    t_sync = time_to(by["sync"]["curve"], target)
    print(f"time to accuracy: held-out {metric} >= {target:.4f} (sync's final)")
    for m in modes:
        r = by[m]
        t = time_to(r["curve"], target)
        pts = " ".join(f"{ti:.0f}s:{v:.3f}" for ti, v in r["curve"])
        ratio = f"{t / t_sync:.2f}x sync" if t is not None and t_sync else "not reached"
        print(f"  {m:8s} {'-' if t is None else f'{t:.1f} s':>8s} ({ratio}); final {r['curve'][-1][1]:.4f}; "
              f"token staleness mean {r['staleness_tokens_mean']:.2f}; curve {pts}")


if __name__ == "__main__":
    main()
