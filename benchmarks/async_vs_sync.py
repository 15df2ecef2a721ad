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
running generation); `async-2p-tis`: that with truncated importance sampling (`algo.tis_cap=2`:
each token's loss weighted by min(exp(learner logp - sampler logp), 2), which corrects for the
tokens sampled by older weights).

Time to accuracy (`--tta`, issue 43; AReaL and verl report this rather than samples/s): every
mode keeps its policy at every step end (`policy_snapshots.keep_snapshots`: a copy of the weights
in memory, its milliseconds taken out of the clock; nothing is evaluated while the run trains,
so an asynchronous run's actor gets no free seconds) and evaluates each afterwards on the
held-out split (`--eval-tasks` tasks x 1 sample, `agentrl eval` on the run's config; the last
one must equal the run's own evaluation after RL, checked). For each mode the script reports
the training wall time (`perf/loop_s` at the step end) at which its held-out `--tta-metric`
first reaches the sync run's final value, and that time over sync's. The metric defaults to
`reward_mean`: this env's reward is the fraction of 'a' characters, so pass@1 (a return of 1)
is 0 for every run.

    python benchmarks/async_vs_sync.py [--steps 12] [--latency 0.5] [--turns 3] [--tokens 48] [--rounds 1]
    python benchmarks/async_vs_sync.py --tta --modes sync,async-2,async-2p --steps 30
    python benchmarks/async_vs_sync.py --seeds 0 1 2 --modes sync,async-2,async-2p --steps 30 \
        --async-steps 42 --eval-tasks 32

`--seeds`: the time to accuracy on each seed (`seed=`; one embedded model per seed, built by the
seed's first run and reused by its other modes; the order of the modes reversed on every other
seed; `--async-steps`: the other modes run longer than sync, so that one that learns less per
sample can still reach sync's final value), the median ratio and range over seeds (`async_tta.aggregate`), written to
`benchmarks/results/async_tta.json` (commit, command, load averages, per seed and mode the curves,
time to target, ratio, final value and its standard error over held-out tasks) and plotted to
`docs/async_tta.png` (`async_tta.plot`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from async_tta import aggregate, plot, task_se, write_json  # noqa: E402
from overhead_common import provenance  # noqa: E402
from policy_snapshots import Snapshots, answers, eval_policies, keep_snapshots, write_snapshots  # noqa: E402

BATCH = 16  # rollout.tasks_per_step=4 x algo.group_size=4
MODES = {  # name -> overrides
    "sync": ["rollout.mode=sync"],
    "async-1": ["rollout.mode=async", "train.max_staleness=2", "rollout.batches_in_flight=1"],
    "async-2": ["rollout.mode=async", "train.max_staleness=2", "rollout.batches_in_flight=2"],
    "async-3": ["rollout.mode=async", "train.max_staleness=3", "rollout.batches_in_flight=3"],
    "async-2p": ["rollout.mode=async", "train.max_staleness=2", "rollout.batches_in_flight=2",
                 "rollout.partial=true"],
    "async-2p-tis": ["rollout.mode=async", "train.max_staleness=2", "rollout.batches_in_flight=2",
                     "rollout.partial=true", "algo.tis_cap=2"],
}


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first training time at which `curve` reaches `target` (None: never)."""
    return next((t for t, v in curve if v >= target - 1e-12), None)


def unknown_modes(modes: list[str]) -> str | None:
    """The error for the names of `modes` that are not keys of MODES (naming them and the known
    ones), None when all are known: checked before any run, not when the unknown one starts."""
    unknown = [m for m in modes if m not in MODES]
    return f"--modes: unknown {', '.join(unknown)} (known: {', '.join(MODES)})" if unknown else None


def steps_of(mode: str, args: argparse.Namespace) -> int:
    """The RL steps `mode` runs: `--steps`, or `--async-steps` for a mode other than sync."""
    return args.steps if mode == "sync" or args.async_steps is None else args.async_steps


def run(mode: str, out: Path, model: str | None, args: argparse.Namespace, seed: int | None = None) -> dict:
    """Train `mode` once into `out` (on `model`, else the embedded model built there; on `seed`,
    else the config's) and return its throughput figures and, with `--tta`, its held-out curves."""
    from agentrl.config import load_config
    from agentrl.train import train

    ov = [f"out={out}", "env.name=latency_env:LatencyEnv", f"env.kwargs.latency_s={args.latency}",
          f"env.kwargs.turns={args.turns}", f"train.steps={steps_of(mode, args)}", "sft.steps=0",
          "rollout.tasks_per_step=4", "algo.group_size=4", f"rollout.max_tokens={args.tokens}",
          "train.eval_tasks=2", "train.eval_samples=1", "train.log_rollouts_every=0", "quiet=true",
          "rollout.env_threads=16", "log.tensorboard=false", *MODES[mode]]
    if args.tta:  # no evaluation inside the loop: the policy of every step is evaluated afterwards
        ov[ov.index("train.eval_tasks=2")] = f"train.eval_tasks={args.eval_tasks}"
        ov.append("train.eval_every=0")
    if model is not None:
        ov.append(f"model.path={model}")
    if seed is not None:
        ov.append(f"seed={seed}")
    with keep_snapshots() if args.tta else contextlib.nullcontext(Snapshots()) as snaps:  # none for samples/s
        summary = train(load_config(None, ov))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/loop_s" in r]
    steady = (steps[-1]["perf/loop_s"] - steps[0]["perf/loop_s"]) / (len(steps) - 1)
    n = len(steps)
    curves = snapshot_curves(snaps, summary, out, model, args) if args.tta else {}
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
            "curve": curves.get("curve"), "curve_samples": curves.get("curve_samples"),
            "final_se": curves.get("final_se"), "at_sync_steps_se": curves.get("at_sync_steps_se"),
            "eval_s": curves.get("eval_s")}


def snapshot_curves(snaps: Snapshots, summary: dict, out: Path, model: str | None,
                    args: argparse.Namespace) -> dict:
    """The held-out curves of one run from its per-step policies (`policy_snapshots`): each
    written to OUT/snaps/step_N and evaluated with `agentrl eval` on the run's config (the first
    `--eval-tasks` held-out tasks x 1 sample, the run's seed) into OUT/evals/step_N; the point
    before RL is the run's own evaluation before RL. Returns "curve" ((training seconds, value)
    per step, `Snapshot.t`), "curve_samples" ((episodes sampled, value)), the standard errors
    over tasks of the last step's value ("final_se") and of the value at `--steps`
    ("at_sync_steps_se"), and the evaluations' seconds. Raises SystemExit when the last policy's
    answers differ from those of the run's own evaluation after RL (both evaluate the final
    weights on the same tasks and sampler seeds)."""
    metric = args.tta_metric
    t0 = time.perf_counter()
    paths = write_snapshots(snaps, Path(model) if model else out / "base_model", out / "snaps")
    evals = eval_policies(paths, out / "config.json", out / "evals", args.eval_tasks, env_threads=32)
    values = [e["overall"][metric] for e in evals]
    if answers(out / "evals" / paths[-1].name) != answers(out / "eval" / "after"):
        raise SystemExit(f"{out}: the last step's policy answers the held-out tasks otherwise than the run's "
                         "own evaluation after RL: the snapshots are not the policy trained")
    before = json.loads((out / "eval" / "before" / "summary.json").read_text())["overall"][metric]
    steps = [s.step for s in snaps.items]
    mid = steps.index(args.steps) if args.steps in steps else len(steps) - 1
    return {"curve": [(0.0, before)] + [(s.t, v) for s, v in zip(snaps.items, values)],
            "curve_samples": [(0, before)] + [(s.step * BATCH, v) for s, v in zip(snaps.items, values)],
            "final_se": task_se(evals[-1]["tasks"], metric), "at_sync_steps_se": task_se(evals[mid]["tasks"], metric),
            "eval_s": time.perf_counter() - t0}


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
    p.add_argument("--eval-tasks", type=int, default=16)
    p.add_argument("--tta-metric", default="reward_mean", help="held-out metric: reward_mean or pass@1")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="time to accuracy on these seeds (implies --tta): every mode once per seed, "
                        "the mode order reversed every other seed; writes --json and --png")
    p.add_argument("--async-steps", type=int, default=None,
                   help="steps of the modes other than sync (default: --steps); longer lets a mode "
                        "that learns less per sample reach sync's final value (time to accuracy)")
    p.add_argument("--json", default="benchmarks/results/async_tta.json", help="with --seeds")
    p.add_argument("--png", default="docs/async_tta.png", help="with --seeds")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    modes = args.modes.split(",")
    if bad := unknown_modes(modes):
        p.error(bad)
    if args.seeds is not None:
        args.tta = True
        if modes[0] != "sync":
            p.error("--seeds needs sync as the first of --modes (the target is sync's final value)")
        return run_seeds(args, modes)
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


def run_seeds(args: argparse.Namespace, modes: list[str]) -> None:
    """Time to accuracy on every seed of `args.seeds`: each seed's modes in order (reversed on
    every other seed, to spread the drift of the machine's load), on one embedded model per seed
    (built by that seed's first run, `seed=` of the config, and reused by its other modes); then
    the per-seed table, the median and range of the ratios over seeds, `args.json`, `args.png`."""
    load0 = os.getloadavg()
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; seeds {args.seeds}, "
          f"{args.steps} steps (other modes {steps_of('async', args)}) x {BATCH} episodes x {args.turns} turns, env latency {args.latency} s/step, "
          f"max {args.tokens} tokens/turn, every step's policy evaluated afterwards on {args.eval_tasks} tasks",
          flush=True)
    seeds: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        for k, seed in enumerate(args.seeds):
            model, runs = None, {}
            for m in (modes if k % 2 == 0 else modes[::-1]):
                t0, out = time.perf_counter(), Path(d) / f"{seed}-{m}"
                runs[m] = run(m, out, model, args, seed=seed)
                model = model or str(out / "base_model")
                print(f"  (seed {seed}: {m} done in {time.perf_counter() - t0:.0f} s, load "
                      f"{os.getloadavg()[0]:.2f})", flush=True)
            seeds[str(seed)] = seed_record(runs, modes)
    load1 = os.getloadavg()
    key = "at_sync_steps" if all(r["modes"][m]["at_sync_steps"] is not None for r in seeds.values()
                                 for m in modes) else "final"  # compare at equal samples when evaluated there
    summary = aggregate({s: r["modes"] for s, r in seeds.items()}, modes, key=key)
    prov = provenance()
    record = {"commit": prov["commit"] + ("+dirty" if prov["dirty"] else ""), "command": "python benchmarks/async_vs_sync.py " + " ".join(sys.argv[1:]),
              "load_average": {"start": list(load0), "end": list(load1)},
              "settings": {"steps": args.steps, "async_steps": args.async_steps, "latency_s": args.latency, "turns": args.turns,
                           "tokens": args.tokens, "evaluated": "every step's policy, after the run",
                           "eval_tasks": args.eval_tasks, "metric": args.tta_metric, "modes": modes,
                           "model": "embedded tiny model, built once per seed (its seed= run)"},
              "seeds": seeds, "summary": summary, "summary_value": key}
    print_seeds(record)
    write_json(Path(args.json), record)
    plot(Path(args.png), record)
    print(f"wrote {args.json} and {args.png}; load average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")


def seed_record(runs: dict[str, dict], modes: list[str]) -> dict:
    """One seed's record: the target (sync's final held-out value) and per mode its curves
    (seconds, samples), time to target, ratio vs sync, final value, its standard error over
    tasks, the held-out value at sync's step count (equal samples; None when not evaluated there)
    with its standard error, the RL loop's seconds and the mean token staleness."""
    target = runs["sync"]["curve"][-1][1]
    t_sync = time_to(runs["sync"]["curve"], target)
    sync_n = runs["sync"]["curve_samples"][-1][0]  # episodes trained on by sync
    out = {}
    for m in modes:
        r = runs[m]
        t = time_to(r["curve"], target)
        out[m] = {"time_to_target_s": t, "ratio": t / t_sync if t is not None and t_sync else None,
                  "final": r["curve"][-1][1], "final_se": r["final_se"], "rl_s": r["rl_s"],
                  "at_sync_steps": dict(r["curve_samples"]).get(sync_n), "at_sync_steps_se": r["at_sync_steps_se"],
                  "staleness_tokens_mean": r["staleness_tokens_mean"],
                  "curve_s": [list(x) for x in r["curve"]], "curve_samples": [list(x) for x in r["curve_samples"]]}
    return {"target": target, "sync_time_to_target_s": t_sync, "modes": out}


def print_seeds(record: dict) -> None:
    """Print the table of `run_seeds` (seed, mode, time to target, ratio, final +- se) and the
    median ratio and range over seeds per mode."""
    metric = record["settings"]["metric"]
    print(f"time to accuracy: held-out {metric} >= each seed's sync final value")
    print(f"{'seed':>4s} {'mode':8s} {'to target':>10s} {'ratio':>6s} {'final':>16s} {'RL loop':>8s}")
    for s, rs in record["seeds"].items():
        for m, r in rs["modes"].items():
            t = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s"
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
            se = "" if r["final_se"] is None else f" +- {r['final_se']:.4f}"
            print(f"{s:>4s} {m:8s} {t:>10s} {ratio:>6s} {r['final']:.4f}{se:10s} {r['rl_s']:7.1f}s")
    for m, a in record["summary"].items():
        med = "-" if a["median_ratio"] is None else f"{a['median_ratio']:.2f}x"
        rng = "" if a["range"] is None else f" (range {a['range'][0]:.2f}-{a['range'][1]:.2f})"
        se = "" if a["final_delta_se"] is None else f" (se {a['final_delta_se']:.4f})"
        print(f"  {m:8s} median ratio {med}{rng}, no ratio on {a['no_ratio']} seed(s); final "
              f"{a['final_mean']:.4f} ({record['summary_value']}), minus sync's {a['final_delta_mean']:+.4f}{se}")


def report_tta(by: dict[str, dict], modes: list[str], metric: str) -> None:
    """Print each mode's held-out curve and its time to sync's final held-out `metric`."""
    target = by["sync"]["curve"][-1][1]
    t_sync = time_to(by["sync"]["curve"], target)
    print(f"time to accuracy: held-out {metric} >= {target:.4f} (sync's final)")
    for m in modes:
        r = by[m]
        t = time_to(r["curve"], target)
        pts = " ".join(f"{ti:.0f}s:{v:.3f}" for ti, v in r["curve"])
        ratio = f"{t / t_sync:.2f}x sync" if t is not None and t_sync else \
            "not reached" if t is None else "no ratio: sync reached it before RL"
        print(f"  {m:8s} {'-' if t is None else f'{t:.1f} s':>8s} ({ratio}); final {r['curve'][-1][1]:.4f}; "
              f"token staleness mean {r['staleness_tokens_mean']:.2f}; curve {pts}")


if __name__ == "__main__":
    main()
