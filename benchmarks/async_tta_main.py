"""Time to accuracy on the main job (issue 43): sync vs async (K=2) vs async with partial
rollouts, to the sync run's final held-out pass@1.

    python benchmarks/async_tta_main.py --work DIR [--seeds 0] [--steps 360] [--async-steps 432]
        [--coarse 40] [--fine 10] [--margin 0.1] [--eval-tasks 256] [--eval-samples 4] [--reuse]

Per seed: the main job's warm start once (`agentrl train --env code_sandbox --algo grpo --steps
0 seed=S`, reused from DIR/warm_S when there), then from it, one mode at a time, the default
main job's RL (`--steps`, the main job's 360) in sync mode, and `--async-steps` steps (the
async modes may learn less per sample; they get the room to reach sync's value) with
`rollout.mode=async train.max_staleness=2 rollout.batches_in_flight=2` (`async-2`) and that with
`rollout.partial=true` (`async-2p`). Nothing is evaluated while a run trains: the learner's
weights are kept every `--fine` steps (`policy_snapshots.keep_snapshots`, in memory, the copy's
milliseconds taken out of the clock) and evaluated afterwards with `agentrl eval` on the run's
config (its held-out evaluation: `--eval-tasks` tasks x `--eval-samples`, the run's seed).
The target is the sync run's final held-out pass@1 (its own evaluation after RL; the last
snapshot of every run must answer as that run's own evaluation, checked). Each mode's policy is
evaluated every `--coarse` steps and at its last step; then every kept step (`--fine` apart)
from the last coarse point more than `--margin` below the target (0.1, about 4 standard errors
of an evaluation: no step near it can reach the target by noise) up to the first coarse point
that reaches it, in order, until one reaches it (`fine_steps`): the time to target is that of
the first kept step that reaches it. Time to target: the training seconds at that step
(`perf/loop_s` less the copies' seconds, `Snapshot.t`); ratio: over sync's. `--reuse`: the
runs already in DIR are not trained again and their evaluations on disk are read, not redone
(refused, naming the difference, for a run trained with other `--steps`/`--async-steps`,
`--eval-tasks` or `--eval-samples`, or an evaluation of other tasks or samples than its run's).
Writes DIR/async_tta_main.json (commit, command, load averages, per seed and mode the
evaluated points, time to target, ratio, final pass@1 and its standard error, seconds per
step, and under "trained" the commit, command and load averages of the call that trained the
run: this call's, or with `--reuse` that of the record already in DIR, per run; under
"summary", per mode over the seeds, the median and range of the ratios and the seeds that did
not reach the target, `async_tta.aggregate`), prints the table, and with `--png` plots the
curves (`plot`). `--speed-check N` (with `--reuse`): the first seed's runs trained by an earlier
call are trained again for N steps and their seconds per step set beside the record's
(`speed_check`, under "speed_check"): is the machine as fast as when they were trained? Nothing
else should run on the machine while runs train (the figure is wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from async_tta import aggregate, task_se, write_json  # noqa: E402
from async_vs_sync import MODES, time_to, unknown_modes  # noqa: E402
from overhead_common import provenance  # noqa: E402
from policy_snapshots import answers, eval_policies, keep_snapshots, write_snapshots  # noqa: E402


def warm_start(work: Path, seed: int) -> Path:
    """WORK/warm_SEED: the main job's warm start on `seed` (reused when there)."""
    warm = work / f"warm_{seed}"
    if (warm / "sft_model" / "config.json").exists() and (warm / "config.json").exists():
        print(f"[warm] reusing {warm}", flush=True)
        return warm
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "code_sandbox", "--algo", "grpo",
           "--steps", "0", "--out", str(warm), "--quiet", f"seed={seed}"]
    print(f"[warm] {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True)
    return warm


def train_mode(mode: str, warm: Path, out: Path, steps: int, a: argparse.Namespace) -> dict[str, Any]:
    """One RL run of `mode` from WARM's warm start into OUT, its policy kept every `a.fine`
    steps and at its last; returns the snapshots' (step, seconds, path), the run's summary
    and its per-step seconds."""
    from rich.console import Console

    from agentrl.config import load_config
    from agentrl.train import train

    ov = [f"model.path={warm / 'sft_model'}", "sft.steps=0", f"train.steps={steps}", "train.eval_every=0",
          "train.save_every=0", "train.log_rollouts_every=0", "log.tensorboard=false", "quiet=true",
          f"train.eval_tasks={a.eval_tasks}", f"train.eval_samples={a.eval_samples}", f"out={out}",
          *MODES[mode]]
    if a.reuse and (out / "summary.json").exists():
        check_settings(out, steps, a)
        return reused_run(out)
    cfg = load_config(str(warm / "config.json"), ov)
    with keep_snapshots(every=a.fine, last=steps) as snaps:
        train(cfg, console=Console(file=open(os.devnull, "w")))
    write_snapshots(snaps, warm / "sft_model", out / "snaps")
    (out / "snaps" / "index.json").write_text(json.dumps({s.step: s.t for s in snaps.items}))
    return reused_run(out)


def check_settings(out: Path, steps: int, a: argparse.Namespace) -> None:
    """`--reuse`: raise SystemExit, naming each difference, when the finished run in OUT was
    trained (OUT/config.json) with other `train.steps` than `steps` or other held-out
    evaluation settings (`train.eval_tasks`, `train.eval_samples`) than `a`'s: its target and
    its evaluations on disk would not be those of this call."""
    train = json.loads((out / "config.json").read_text())["train"]
    want = {"steps": steps, "eval_tasks": a.eval_tasks, "eval_samples": a.eval_samples}
    diff = [f"train.{k}={train.get(k)} (this call: {v})" for k, v in want.items() if train.get(k) != v]
    if diff:
        raise SystemExit(f"--reuse: {out} was trained with {', '.join(diff)}; run with its settings "
                         "or another --work")


def check_eval(done: Path, out: Path) -> dict[str, Any]:
    """`--reuse`: the evaluation summary DONE (OUT/evals/step_N/summary.json), read; raises
    SystemExit when its task count or samples per task differ from those of the run's own
    evaluation after RL (OUT/eval/after), so that no value on other tasks is mixed in."""
    e, after = (json.loads(p.read_text()) for p in (done, out / "eval" / "after" / "summary.json"))
    got, want = ((x["overall"]["tasks"], x["meta"]["samples"]) for x in (e, after))
    if got != want:
        raise SystemExit(f"--reuse: {done.parent} evaluated {got[0]} tasks x {got[1]} samples, the run's "
                         f"evaluation after RL {want[0]} x {want[1]}: delete it to evaluate it again")
    return e


def reused_run(out: Path) -> dict[str, Any]:
    """A finished run of `train_mode` in OUT: its kept policies (step -> (training seconds, path):
    OUT/snaps/index.json, written with them; for a run of 88e7ead, which wrote none,
    `perf/loop_s` of the step, the copies' seconds, at most 0.2 s a run, not taken out), the
    run's summary and its seconds per step."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    loop = {int(r["step"]): r["perf/loop_s"] for r in rows if "perf/loop_s" in r}
    index = out / "snaps" / "index.json"
    ts = {int(k): v for k, v in json.loads(index.read_text()).items()} if index.exists() else loop
    kept = sorted(int(d.name.removeprefix("step_")) for d in (out / "snaps").glob("step_*"))
    summary = json.loads((out / "summary.json").read_text())
    return {"points": {k: (ts[k], str(out / "snaps" / f"step_{k}")) for k in kept}, "summary": summary,
            "s_per_step": loop[max(loop)] / len(loop), "rl_s": summary.get("rl_s")}


def value(run: dict[str, Any], step: int, out: Path, a: argparse.Namespace, cache: dict) -> tuple[float, float | None]:
    """Held-out pass@1 (and its standard error over tasks) of `run`'s policy at `step`,
    evaluated once (OUT/evals/step_N)."""
    if step not in cache:
        path = Path(run["points"][step][1])
        done = out / "evals" / path.name / "summary.json"  # `--reuse`: evaluated by an earlier call
        e = (check_eval(done, out) if a.reuse and done.exists() else
             eval_policies([path], out / "config.json", out / "evals", a.eval_tasks, None, a.eval_samples)[0])
        cache[step] = (e["overall"]["pass@1"], task_se(e["tasks"], "pass@1"))
        print(f"  [eval] {out.name} step {step}: pass@1 {cache[step][0]:.3f}", flush=True)
    return cache[step]


def fine_steps(steps: list[int], coarse: dict[int, float], target: float, margin: float) -> list[int]:
    """The kept steps to evaluate, in order, after the coarse ones: every kept step after the
    last coarse step whose value is more than `margin` below `target` (0: before RL), up to
    the first coarse step that reaches `target` (to the last kept step when none does). A
    step between two coarse points can reach the target only by the evaluation's noise; with
    `margin` at about 4 standard errors of an evaluation, the steps left out cannot.

    Args:
        steps: every kept step, ascending.
        coarse: coarse step -> held-out value.
        target: the value to reach.
        margin: how far below `target` a coarse value rules its neighbours out.
    """
    hit = next((s for s in sorted(coarse) if coarse[s] >= target - 1e-12), None)
    end = hit if hit is not None else steps[-1] + 1
    start = max([s for s in coarse if s < end and coarse[s] < target - margin], default=0)
    return [s for s in steps if start < s < end and s not in coarse]


def curve_to(run: dict[str, Any], out: Path, target: float | None, a: argparse.Namespace) -> dict[str, Any]:
    """The coarse points of `run` (every `a.coarse` steps and the last), then the fine points
    of `fine_steps` in order until one reaches `target`; the evaluated points, the time to
    target (None: not reached), the final value and the run's seconds. Raises SystemExit when
    the last policy answers otherwise than the run's own evaluation after RL."""
    steps = sorted(run["points"])
    last = steps[-1]
    cache: dict[int, tuple[float, float | None]] = {}
    coarse = [s for s in steps if s % a.coarse == 0 or s == last]
    for s in coarse:
        value(run, s, out, a, cache)
    if answers(out / "evals" / f"step_{last}") != answers(out / "eval" / "after"):
        raise SystemExit(f"{out}: the last policy answers otherwise than the run's own evaluation after RL")
    if target is not None:
        for s in fine_steps(steps, {s: cache[s][0] for s in coarse}, target, a.margin):
            if value(run, s, out, a, cache)[0] >= target - 1e-12:
                break
    pts = sorted((run["points"][s][0], cache[s][0], s) for s in cache)
    t = time_to([(x, v) for x, v, _ in pts], target) if target is not None else None
    return {"points": [{"step": s, "t": x, "pass@1": v, "se": cache[s][1]} for x, v, s in pts],
            "time_to_target_s": t, "final": cache[last][0], "final_se": cache[last][1],
            "s_per_step": run["s_per_step"], "rl_s": run["rl_s"], "steps": last}


def trained_by(prev: dict[str, Any] | None, seed: int, mode: str) -> dict[str, Any] | None:
    """`--reuse`: the record of the call that trained the run of `seed` and `mode`, from PREV (the
    record already in the work dir): its per-run "trained", or for a record written before runs
    carried one, the record's "training" (a call that reused them) or its own commit, command
    and load averages; None when PREV holds no such run."""
    run = ((prev or {}).get("seeds") or {}).get(str(seed), {}).get("modes", {}).get(mode)
    if run is None:
        return None
    if "trained" in run:
        return run["trained"]
    return prev.get("training") or {k: prev.get(k) for k in ("commit", "dirty", "command", "load_average")}


def plot(path: Path, record: dict[str, Any]) -> None:
    """Held-out pass@1 of every evaluated policy vs training seconds (top row) and vs RL step
    (bottom row: equal samples, each step the same batch), one column per seed, the modes
    overlaid, ± one standard error as bars; a dashed line at each seed's target (sync's final)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = list(record["seeds"])
    fig, axes = plt.subplots(2, len(seeds), figsize=(4.4 * len(seeds), 6.6), squeeze=False)
    for j, s in enumerate(seeds):
        rs = record["seeds"][s]
        for m, r in rs["modes"].items():
            t = f"{r['time_to_target_s']:.0f} s" if r["time_to_target_s"] is not None else "not reached"
            ratio = f", {r['ratio']:.2f}x" if r["ratio"] is not None else ""
            pts = sorted(r["points"], key=lambda q: q["step"])
            ys, es = [q["pass@1"] for q in pts], [q["se"] or 0.0 for q in pts]
            axes[0][j].errorbar([q["t"] for q in pts], ys, yerr=es, marker="o", ms=2.5, lw=1, elinewidth=0.5,
                                label=f"{m}: {t}{ratio}")
            axes[1][j].errorbar([q["step"] for q in pts], ys, yerr=es, marker="o", ms=2.5, lw=1, elinewidth=0.5,
                                label=m)
        for i in (0, 1):
            axes[i][j].axhline(rs["target"], ls="--", c="grey", lw=0.8)
            axes[i][j].set_ylabel("held-out pass@1 (256 x 4)")
            axes[i][j].legend(fontsize=7)
        axes[0][j].set_title(f"seed {s}: target {rs['target']:.3f} (sync's final)", fontsize=9)
        axes[0][j].set_xlabel("training seconds")
        axes[1][j].set_xlabel("RL step (16 tasks x 8 samples each)")
    fig.suptitle(f"main job, time to accuracy (async_tta_main.py, evaluated on {record['commit']})", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def step_seconds(out: Path, last: int) -> list[float]:
    """`perf/step_s` of steps 2..`last` of the run in OUT (step 1 holds the start-up)."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r["perf/step_s"] for r in rows if "perf/step_s" in r and 2 <= int(r["step"]) <= last]


def speed_check(work: Path, seed: int, modes: list[str], steps: int) -> dict[str, Any]:
    """Is the machine as fast now as when the reused runs were trained? Each mode of `modes`
    trains `steps` steps again from WORK/warm_SEED into WORK/check_SEED_MODE (same settings as
    its run, a 8-task evaluation), and the median seconds of its steps 2..`steps` are set beside
    those of the same steps of the run in WORK/sSEED_MODE (same warm start; a sync run samples
    the same batches). Returns per mode `now_s`, `record_s`, `ratio` (now / record)."""
    import statistics

    a = argparse.Namespace(reuse=False, fine=steps, eval_tasks=8, eval_samples=1)
    out: dict[str, Any] = {}
    for m in modes:
        check = work / f"check_{seed}_{m}"
        shutil.rmtree(check, ignore_errors=True)
        train_mode(m, work / f"warm_{seed}", check, steps, a)
        now = statistics.median(step_seconds(check, steps))
        rec = statistics.median(step_seconds(work / f"s{seed}_{m}", steps))
        out[m] = {"now_s": now, "record_s": rec, "ratio": now / rec}
        print(f"[speed check] seed {seed} {m}: steps 2-{steps} median {now:.3f} s now, {rec:.3f} s in the "
              f"record ({now / rec:.2f}x)", flush=True)
    return out


def args_error(modes: list[str], coarse: int, fine: int) -> str | None:
    """The error for `--modes` (sync first, each once, every name a key of MODES) and the grid (`--coarse` a
    multiple of `--fine`: only kept steps can be coarse points, else the coarse grid is silently
    their least common multiple), None when they are right."""
    if modes[0] != "sync":
        return "--modes must start with sync (the target is its final value)"
    if len(set(modes)) < len(modes):
        return f"--modes names a mode twice ({','.join(modes)}): its second run would overwrite the first's folder"
    if fine < 1 or coarse % fine:
        return f"--coarse ({coarse}) must be a multiple of --fine ({fine}): the coarse steps are kept steps"
    return unknown_modes(modes)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--modes", default="sync,async-2,async-2p")
    p.add_argument("--steps", type=int, default=360, help="sync's RL steps (the main job's train.steps)")
    p.add_argument("--async-steps", type=int, default=432)
    p.add_argument("--coarse", type=int, default=40)
    p.add_argument("--fine", type=int, default=10)
    p.add_argument("--margin", type=float, default=0.1,
                   help="fine grid: every kept step after the last coarse value this far below the target")
    p.add_argument("--reuse", action="store_true",
                   help="reuse the runs and evaluations already in --work (a finished run is not trained again)")
    p.add_argument("--eval-tasks", type=int, default=256)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--png", default=None, help="also plot the curves there (docs/async_tta_main.png)")
    p.add_argument("--speed-check", type=int, default=0, metavar="N",
                   help="with --reuse: retrain the first seed's reused runs for N steps and compare their "
                        "seconds per step with the record's (speed_check; 0: off)")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    modes = a.modes.split(",")
    if bad := args_error(modes, a.coarse, a.fine):
        p.error(bad)
    prov, load0 = provenance(), os.getloadavg()
    command = "python benchmarks/async_tta_main.py " + " ".join(argv or sys.argv[1:])
    prev = json.loads(old.read_text()) if a.reuse and (old := work / "async_tta_main.json").exists() else None
    seeds: dict[str, Any] = {}
    reused_first: list[str] = []  # the first seed's runs trained by an earlier call
    for k, seed in enumerate(a.seeds):
        warm = warm_start(work, seed)
        runs, trained = {}, {}
        for m in (modes if k % 2 == 0 else [modes[0], *modes[:0:-1]]):  # sync first: its value is the target
            t0, out = time.perf_counter(), work / f"s{seed}_{m}"
            fresh = not (a.reuse and (out / "summary.json").exists())
            if k == 0 and not fresh:
                reused_first.append(m)
            l0 = os.getloadavg()
            runs[m] = train_mode(m, warm, out, a.steps if m == "sync" else a.async_steps, a)
            trained[m] = ({**prov, "command": command, "load_average": {"start": list(l0), "end": list(os.getloadavg())}}
                          if fresh else trained_by(prev, seed, m))
            print(f"[{m}] seed {seed}: {'trained' if fresh else 'reused'} in {time.perf_counter() - t0:.0f} s "
                  f"({runs[m]['s_per_step']:.2f} s/step), load {os.getloadavg()[0]:.2f}", flush=True)
        target = runs["sync"]["summary"]["eval_after"]["pass@1"]
        res = {m: {**curve_to(runs[m], work / f"s{seed}_{m}", target, a), "trained": trained[m]} for m in modes}
        t_sync = res["sync"]["time_to_target_s"]
        for r in res.values():
            r["ratio"] = r["time_to_target_s"] / t_sync if r["time_to_target_s"] and t_sync else None
        seeds[str(seed)] = {"target": target, "modes": res}
    record = {**prov, "command": command, "load_average": {"start": list(load0), "end": list(os.getloadavg())},
              "settings": vars(a), "seeds": seeds}
    record["summary"] = aggregate({s: r["modes"] for s, r in seeds.items()}, modes)
    if a.speed_check and reused_first:
        l0 = os.getloadavg()
        record["speed_check"] = {"seed": a.seeds[0], "steps": a.speed_check, "commit": prov.get("commit"),
                                 "modes": speed_check(work, a.seeds[0], reused_first, a.speed_check),
                                 "load_average": {"start": list(l0), "end": list(os.getloadavg())}}
    write_json(work / "async_tta_main.json", record)
    if a.png:
        plot(Path(a.png), record)
    print(f"time to the sync run's final held-out pass@1 ({a.eval_tasks} tasks x {a.eval_samples})")
    for s, r in seeds.items():
        for m, x in r["modes"].items():
            t = "-" if x["time_to_target_s"] is None else f"{x['time_to_target_s']:.0f} s"
            ratio = "-" if x["ratio"] is None else f"{x['ratio']:.2f}x"
            print(f"seed {s} {m:8s} target {r['target']:.3f}: {t:>7s} {ratio:>6s}  final {x['final']:.3f} "
                  f"± {x['final_se'] or 0:.3f} (step {x['steps']}), {x['s_per_step']:.2f} s/step")
    for m, x in record["summary"].items():
        med = "-" if x["median_ratio"] is None else f"{x['median_ratio']:.2f}x"
        print(f"{m:8s} median ratio {med} over the seeds that reached the target, range {x['range']}, "
              f"not reached on {x['no_ratio']} of {len(seeds)}")
    return record


if __name__ == "__main__":
    main()
