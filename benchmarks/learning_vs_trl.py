"""Learning, not speed: TRL's GRPOTrainer vs agentrl on the main job, same wall-clock budget.

    pip install -e '.[bench,log]'                  # TRL (trl>=1.16); matplotlib (log extra) for the PNG
    python benchmarks/learning_vs_trl.py           # 3 repeats x 360 s of training per side
    python benchmarks/learning_vs_trl.py --budget-s 40 --every-s 20 --eval-tasks 16 --repeats 1   # smoke run
    python benchmarks/learning_vs_trl.py --reuse   # re-evaluate / re-plot the runs already in --work

About an hour with the defaults on 2 cores (3687 s measured at c482981, 3291 s at 757bf06
with the warm start reused): the warm start (~2 min, once; reused from `--work` afterwards),
then per repeat 2 x (360 s + set-up) of training and about 28 evaluations of 256 tasks x 4
samples (~12-16 s each). Nothing else should
run on the machine meanwhile (the figure is wall time).

What it does (benchmarks/README.md has the settings table):

1. Warm start, once: `python -m agentrl.cli train --env code_sandbox --algo grpo --steps 0
   --out WORK/warm --quiet` (the embedded tiny model + tokenizer and the supervised warm start;
   WORK/warm/sft_model is the starting point of both sides, WORK/warm/config.json the run config).
2. `--repeats` times (WORK/repR), trains each side ONE AT A TIME, each in its own process
   (OMP/torch threads 1, offline), the side trained first alternating between repeats, for
   `--budget-s` seconds of training wall clock, saving the policy at the first step end after
   every `--fine-s` seconds and at the budget; the save time is not counted. TRL:
   `learning_vs_trl_trl.py` (GRPOTrainer, clock from `on_train_begin`); agentrl:
   `learning_vs_trl_ours.py` (`agentrl.train.train`, clock `perf/loop_s`). Same training tasks
   in the same order (the seeds agentrl's `run_batch` draws per step, as TRL dataset rows), same
   reward (the code_sandbox env's extraction and sandbox verdict), same group size, tasks per
   step, temperature, max tokens, learning rate and loss settings as far as TRL allows.
3. Evaluates the warm start (t = 0, once) and, per repeat and side, the coarse grid: the
   checkpoints a clock every `--every-s` seconds would have saved (`coarse_indices`), with
   agentrl's evaluation harness (`agentrl.eval.cli.eval_command`, the `agentrl eval --model
   CKPT -c WORK/warm/config.json` of the CLI): the run's held-out evaluation (first
   `train.eval_tasks` = 256 tasks of the held-out list x `train.eval_samples` = 4, T = 1, the
   run's seed); `--eval-tasks` cuts it. Then the fine grid near the crossing (`first_reach`): on
   each side, the `--fine-s` checkpoints between the last coarse checkpoint below TRL's best and
   the first at or above it, in time order, until one reaches it.
4. Checks (printed and in the JSON), per repeat: TRL's tokenized prompts equal agentrl's
   `ChatRenderer.prompt_ids` (first 1024 rows); TRL's rewards of its first 2 steps' answers
   equal the env's own `step` rewards; both sides trained on the tasks of the same seeds.
5. Writes `--json` (benchmarks/results/learning_vs_trl.json), `--md` (the settings table, one
   row per repeat, the verdict, each repeat's curves, benchmarks/results/learning_vs_trl.md)
   and `--png` (docs/learning_vs_trl.png: held-out pass@1 vs training wall seconds and vs
   samples, every repeat), and prints the verdict against issue 43's target "agentrl reaches
   TRL's best held-out pass@1 in at most 0.4x TRL's wall time (the median of the repeats), and
   is not worse per sample".

Verdict, per repeat (`verdict`): TRL's best pass@1 over its coarse curve (warm start
included); the time each side first reached it on the fine grid; agentrl's time over TRL's.
Per sample: agentrl's coarse curve linearly interpolated at each coarse TRL checkpoint's sample
count (within agentrl's range); "not worse" when the mean difference agentrl - TRL is above -2
standard errors (the evaluations' standard errors over tasks, taken as independent); the strict
reading (mean difference >= 0) is printed too. Over the repeats (`summary`): the median and
range of the ratios (a repeat where agentrl never reached TRL's best counts as infinite); met
when the median is <= 0.4 and every repeat is not worse per sample.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from overhead_common import git_commit  # noqa: E402
from vs_trl import worker_env  # noqa: E402  (the speed benchmark's offline, 1-thread environment)

SIDES = ("trl", "ours")
LABEL = {"trl": "TRL GRPOTrainer", "ours": "agentrl"}
TARGET_TIME_RATIO = 0.4  # issue 43: <= 0.4x TRL's wall time to its best


# -- running ------------------------------------------------------------------------------------
def build_warm(work: Path, extra: list[str], timeout: float) -> Path:
    """WORK/warm: the main job with `--steps 0` (model, tokenizer, warm start); reused when
    WORK/warm/sft_model exists."""
    warm = work / "warm"
    if (warm / "sft_model" / "config.json").exists() and (warm / "config.json").exists():
        print(f"[warm] reusing {warm}", flush=True)
        return warm
    shutil.rmtree(warm, ignore_errors=True)
    shutil.rmtree(work / "eval", ignore_errors=True)  # the old warm start's evaluation
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "code_sandbox", "--algo", "grpo",
           "--steps", "0", "--out", str(warm), "--quiet", *extra]
    print(f"[warm] {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    log = work / "warm.log"
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=worker_env(), timeout=timeout).returncode
    if rc != 0 or not (warm / "sft_model" / "config.json").exists():
        raise RuntimeError(f"warm start failed (rc {rc}):\n{log.read_text()[-3000:]}")
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("[sft]")]
    print(f"[warm] done in {time.perf_counter() - t0:.0f} s" + (f": {lines[-1]}" if lines else ""), flush=True)
    return warm


def run_side(side: str, warm: Path, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    """Train one side in its own process (nothing else of ours runs meanwhile), saving a
    checkpoint every `--fine-s` seconds of training; its result (WORK/SIDE/result.json)."""
    out = work / side
    shutil.rmtree(out, ignore_errors=True)  # its checkpoints and their evaluations
    out.mkdir(parents=True)
    script = HERE / f"learning_vs_trl_{side}.py"
    cmd = [sys.executable, str(script), "--warm", str(warm), "--out", str(out), "--budget-s",
           str(a.budget_s), "--every-s", str(a.fine_s), "--max-steps", str(a.max_steps)]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    print(f"[{side}] training for {a.budget_s:.0f} s (log {out / 'worker.log'}) ...", flush=True)
    with (out / "worker.log").open("w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=worker_env(),
                              timeout=a.budget_s + a.timeout)
    text = (out / "worker.log").read_text()
    if proc.returncode != 0 or not (out / "result.json").exists():
        raise RuntimeError(f"{side} worker failed (rc {proc.returncode}):\n{text[-4000:]}")
    res = json.loads((out / "result.json").read_text())
    res["process_wall_s"] = time.perf_counter() - t0
    res["loadavg_before"], res["loadavg_after"] = list(load0), list(os.getloadavg())
    res["commit"] = git_commit("benchmarks/results", "docs/learning_vs_trl.png")
    (out / "result.json").write_text(json.dumps(res, indent=1))
    cks = res["checkpoints"]
    print(f"[{side}] {res['steps_done']} steps, {len(cks)} checkpoints, last at "
          f"{cks[-1]['wall_s']:.0f} s / {cks[-1]['samples']} samples; process {res['process_wall_s']:.0f} s "
          f"(load avg {load0[0]:.1f} -> {res['loadavg_after'][0]:.1f})", flush=True)
    return res


def evaluate(model_dir: Path, warm: Path, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    """agentrl's held-out evaluation of `model_dir` (in this process, one at a time), reused
    when OUT/summary.json exists; returns summary["overall"]."""
    if (out / "summary.json").exists():
        return json.loads((out / "summary.json").read_text())["overall"]
    from rich.console import Console

    from agentrl.eval.cli import eval_command

    t0 = time.perf_counter()
    s = eval_command(model=str(model_dir), config=str(warm / "config.json"), out=str(out),
                     max_tasks=a.eval_tasks, samples=a.eval_samples, console=Console(file=io.StringIO()))
    o = s["overall"]
    print(f"[eval] {out.name}: pass@1 {o['pass@1']:.3f} ± {o['pass@1_se']:.3f} ({o['tasks']} tasks, "
          f"{o['episodes']} episodes, {time.perf_counter() - t0:.0f} s)", flush=True)
    return o


def eval_tag(a: argparse.Namespace, cfg: Any) -> str:
    n = a.eval_tasks or cfg.train.eval_tasks
    return f"{n}x{a.eval_samples or cfg.train.eval_samples}"


# -- checks -------------------------------------------------------------------------------------
def reward_check(cfg: Any, recorded: list[dict[str, Any]]) -> dict[str, Any]:
    """TRL's rewards of recorded answers vs the env's own `step` on the same answer and task."""
    from learning_vs_trl_common import env_reward

    from agentrl.run import build_env

    env = build_env(cfg, "train")
    diff = [r for r in recorded if env_reward(env, r["seed"], r["text"]) != r["reward"]]
    return {"checked": len(recorded), "different": len(diff), "passing": sum(r["reward"] == 1.0 for r in recorded),
            "examples": diff[:3]}


def seed_check(cfg: Any, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Both sides' per-step task seeds vs `step_seeds` (the steps each side ran)."""
    from learning_vs_trl_common import step_seeds

    out = {}
    for side, res in results.items():
        seen = res.get("step_seeds") or []
        bad = [i for i, s in enumerate(seen)
               if sorted(s) != sorted(set(step_seeds(cfg.seed, i, cfg.rollout.tasks_per_step)))]
        out[side] = {"steps": len(seen), "different": len(bad), "first_different": bad[:5]}
    return out


# -- analysis -----------------------------------------------------------------------------------
def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise ValueError(f"{x} outside [{xs[0]}, {xs[-1]}]")


def coarse_indices(cks: list[dict[str, Any]], every_s: float) -> list[int]:
    """Indices of the checkpoints (in time order, `wall_s` each) that a clock saving every
    `every_s` seconds would have saved: for each multiple of `every_s`, the first checkpoint at
    or after it (one checkpoint covers every multiple it passed, as `Clock` does), and the last."""
    out: list[int] = []
    m = 1
    for i, c in enumerate(cks):
        if c["wall_s"] >= m * every_s:
            out.append(i)
            while m * every_s <= c["wall_s"]:
                m += 1
    if cks and (not out or out[-1] != len(cks) - 1):
        out.append(len(cks) - 1)
    return out


def first_reach(co: list[int], threshold: float, get: Any) -> int | None:
    """The first checkpoint with pass@1 >= `threshold`, on the fine grid: the first coarse
    checkpoint (index in `co`) that reaches it, then the fine ones between the coarse checkpoint
    before it and it, in time order, evaluated by `get(i) -> point` until one reaches it. -1 is
    the warm start; None when no coarse checkpoint reaches it."""
    r = next((i for i in co if get(i)["pass@1"] >= threshold), None)
    if r is None:
        return None
    lo = max((i for i in co if i < r), default=-1)
    return next((i for i in range(lo + 1, r) if get(i)["pass@1"] >= threshold), r)


def verdict(curves: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The target's two parts from the curves (lists of points `wall_s`, `samples`, `pass@1`,
    `pass@1_se` and `grid` ("coarse", the default, or "fine"), in time order, the warm start
    first).

    Time: TRL's best is the highest pass@1 of its coarse points (the earliest of equal maxima);
    each side's time is that of its first point, on either grid, at or above it (so both sides
    are timed on the same grid); the ratio agentrl / TRL. Per sample: agentrl's coarse curve
    interpolated linearly at each coarse TRL point's sample count."""
    def grid(side: str) -> list[dict[str, Any]]:
        return [p for p in curves[side] if p.get("grid", "coarse") == "coarse"]

    trl, ours = grid("trl"), grid("ours")
    best = max(trl, key=lambda p: p["pass@1"])  # the first of equal maxima: the earliest
    t_reach = next(p for p in curves["trl"] if p["pass@1"] >= best["pass@1"])
    reach = next((p for p in curves["ours"] if p["pass@1"] >= best["pass@1"]), None)
    v: dict[str, Any] = {"trl_best_pass@1": best["pass@1"], "trl_best_se": best["pass@1_se"],
                         "trl_best_wall_s": best["wall_s"], "trl_best_samples": best["samples"],
                         "trl_reach_wall_s": t_reach["wall_s"], "trl_reach_samples": t_reach["samples"],
                         "ours_best_pass@1": max(p["pass@1"] for p in ours),
                         "ours_reach_wall_s": reach["wall_s"] if reach else None,
                         "ours_reach_samples": reach["samples"] if reach else None}
    if best["wall_s"] <= 0:
        v.update(time_ratio=None, time_met=None,
                 time_note="TRL never rose above the warm start: the time part is undefined")
    elif reach is None:
        v.update(time_ratio=None, time_met=False, time_note="agentrl never reached TRL's best")
    else:
        v["time_ratio"] = reach["wall_s"] / t_reach["wall_s"]
        v["time_met"] = v["time_ratio"] <= TARGET_TIME_RATIO
        v["time_note"] = (f"agentrl reached {best['pass@1']:.3f} at {reach['wall_s']:.0f} s, TRL at "
                          f"{t_reach['wall_s']:.0f} s: {v['time_ratio']:.3f}x TRL's time (target <= {TARGET_TIME_RATIO})")
    xs = [p["samples"] for p in ours]
    matched = []
    for p in trl:
        if p["samples"] <= 0 or p["samples"] > xs[-1]:
            continue
        o = _interp(p["samples"], xs, [q["pass@1"] for q in ours])
        o_se = _interp(p["samples"], xs, [q["pass@1_se"] for q in ours])
        matched.append({"samples": p["samples"], "trl": p["pass@1"], "ours": o, "diff": o - p["pass@1"],
                        "se": math.hypot(o_se, p["pass@1_se"])})
    v["per_sample"] = matched
    if matched:
        d = sum(m["diff"] for m in matched) / len(matched)
        se = math.sqrt(sum(m["se"] ** 2 for m in matched)) / len(matched)
        v.update(per_sample_mean_diff=d, per_sample_se=se, per_sample_met=d >= 0 or d > -2 * se,  # equal curves are not worse, SE 0 or not
                 per_sample_strict=d >= 0,
                 per_sample_note=(f"agentrl - TRL at {len(matched)} matched sample counts: mean "
                                  f"{d:+.3f} ± {se:.3f} (not worse: > -2 SE; strict: >= 0)"))
    else:
        v.update(per_sample_mean_diff=None, per_sample_se=None, per_sample_met=None, per_sample_strict=None,
                 per_sample_note="no TRL checkpoint within agentrl's sample range")
    parts = [v["time_met"], v["per_sample_met"]]
    v["met"] = None if None in parts else all(parts)
    return v


def summary(verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats together: the median and range of the time ratios (a repeat where agentrl
    never reached TRL's best counts as +inf, one where TRL never rose is left out) and of the
    per-sample differences. Met when the median ratio is at most the target and every repeat is
    not worse per sample."""
    import statistics

    ratios = [math.inf if v["time_met"] is False and v["time_ratio"] is None else v["time_ratio"]
              for v in verdicts if v["time_met"] is not None]
    diffs = [v["per_sample_mean_diff"] for v in verdicts if v["per_sample_mean_diff"] is not None]
    s: dict[str, Any] = {"repeats": len(verdicts), "time_ratios": ratios,
                         "time_ratio_median": statistics.median(ratios) if ratios else None,
                         "time_ratio_min": min(ratios) if ratios else None,
                         "time_ratio_max": max(ratios) if ratios else None,
                         "per_sample_diffs": diffs,
                         "per_sample_median": statistics.median(diffs) if diffs else None,
                         "per_sample_all_met": all(v["per_sample_met"] for v in verdicts)
                         if all(v["per_sample_met"] is not None for v in verdicts) else None}
    s["time_met"] = None if s["time_ratio_median"] is None else s["time_ratio_median"] <= TARGET_TIME_RATIO
    parts = [s["time_met"], s["per_sample_all_met"]]
    s["met"] = None if None in parts else all(parts)
    return s


def summary_text(s: dict[str, Any]) -> str:
    word = {True: "MET", False: "NOT met", None: "undetermined"}
    if s["time_ratio_median"] is None:
        ratio = "undefined in every repeat"
    else:
        ratio = (f"median {s['time_ratio_median']:.3f}x, range {s['time_ratio_min']:.3f}-"
                 f"{s['time_ratio_max']:.3f}x over {len(s['time_ratios'])} repeats ("
                 + ", ".join(f"{r:.3f}" for r in s["time_ratios"]) + ")")
    diffs = ", ".join(f"{d:+.3f}" for d in s["per_sample_diffs"]) or "none"
    return (f"Over {s['repeats']} repeats: agentrl reaches TRL's best held-out pass@1 in at most "
            f"{TARGET_TIME_RATIO}x TRL's wall time (the median), and is not worse per sample in every repeat "
            f"-> {word[s['met']]}.\n- time: {ratio} -> {word[s['time_met']]}\n"
            f"- per sample: mean differences agentrl - TRL {diffs} -> {word[s['per_sample_all_met']]}")


def verdict_text(v: dict[str, Any]) -> str:
    word = {True: "MET", False: "NOT met", None: "undetermined"}
    return (f"Target: agentrl reaches TRL's best held-out pass@1 in at most {TARGET_TIME_RATIO}x TRL's wall "
            f"time, and is not worse per sample -> {word[v['met']]}.\n"
            f"- time: TRL's best pass@1 (coarse grid) {v['trl_best_pass@1']:.3f} ± {v['trl_best_se']:.3f} at "
            f"{v['trl_best_wall_s']:.0f} s ({v['trl_best_samples']} samples), first reached at "
            f"{v['trl_reach_wall_s']:.0f} s; {v['time_note']} -> {word[v['time_met']]}\n"
            f"- per sample: {v['per_sample_note']} -> {word[v['per_sample_met']]}"
            + ("" if v["per_sample_strict"] is None else f" (strict: {word[v['per_sample_strict']]})"))


def curves_table(curves: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["| side | checkpoint | training wall s | samples | steps | held-out pass@1 ± SE | pass@k ± SE |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for side in SIDES:
        for p in curves[side]:
            pk = f"{p['pass@k']:.3f} ± {p['pass@k_se']:.3f} (k={p['k']})" if p.get("pass@k") is not None else "-"
            name = p["name"] + (" (fine)" if p.get("grid") == "fine" else "")
            lines.append(f"| {LABEL[side]} | {name} | {p['wall_s']:.0f} | {p['samples']} | {p['step']} | "
                         f"{p['pass@1']:.3f} ± {p['pass@1_se']:.3f} | {pk} |")
    return "\n".join(lines)


def settings_table(cfg: Any, trl: dict[str, Any], ours: dict[str, Any], checks: dict[str, Any]) -> str:
    """Both sides' settings as they ran (TRL's GRPOConfig after its own derivations)."""
    d, c = trl["derived"], ours["config"]
    r, al, tr = c["rollout"], c["algo"], c["train"]
    pc = checks["prompt_ids"]
    rows = [
        ("prompts x generations per step", f"`per_device_train_batch_size={d['per_device_train_batch_size']}`, "
         f"`num_generations={d['num_generations']}` (generation batch {d['generation_batch_size']})",
         f"`rollout.tasks_per_step={r['tasks_per_step']}`, `algo.group_size={al['group_size']}`"),
        ("training tasks", "dataset rows = the seeds agentrl draws per step, in its order, `shuffle_dataset=False`",
         "`np.random.default_rng([seed, step])` seeds of the code_sandbox training split"),
        ("prompt", "conversational (system + user), TRL applies the chat template",
         f"`ChatRenderer.prompt_ids`: {pc['checked'] - pc['different']}/{pc['checked']} prompts equal"),
        ("max completion tokens, stop", f"`max_completion_length={d['max_completion_length']}`, eos ids {d['eos_token_ids']}",
         f"`rollout.max_tokens={r['max_tokens']}`, stop ids <|im_end|>, eos"),
        ("sampling", f"temperature {d['temperature']}, top_p {d['top_p']}, top_k {d['top_k']}",
         f"temperature {r['temperature']}, top_p {r['top_p']}"),
        ("reward", "env's `extract_code` + `sandbox_job` + sandbox pool on the answer decoded as agentrl decodes it "
         "(every answer run: `run_tests(cache=False)`, TRL has no verdict cache)",
         f"the env's `step` (`reward={c['env']['kwargs'].get('reward', 'binary')}`, `cache_verdicts="
         f"{str(c['env']['kwargs'].get('cache_verdicts', True)).lower()}`: an answer equal to one already judged "
         "takes that verdict)"),
        ("optimizer", f"AdamW (`{d['optim']}`), lr {d['learning_rate']}, `{d['lr_scheduler_type']}`, wd {d['weight_decay']}, "
         f"betas {d['adam_beta1']}/{d['adam_beta2']}, eps {d['adam_epsilon']}, `max_grad_norm={d['max_grad_norm']}`",
         f"AdamW (fused), `train.lr={tr['lr']}`, constant, wd {tr['weight_decay']}, `grad_clip={tr['grad_clip']}`"),
        ("optimizer steps per batch", f"1 (`num_iterations={d['num_iterations']}`, `steps_per_generation="
         f"{d['steps_per_generation']}`, grad. accumulation {d['gradient_accumulation_steps']})",
         f"1 (`update_epochs={al['update_epochs']}`, `minibatches={al['minibatches']}`)"),
        ("forward/backward", "the whole batch at once", f"`micro_batch_size={tr['micro_batch_size']}`, accumulated "
         f"(`prefix_share={tr['prefix_share']}`, `skip_zero_advantage={tr['skip_zero_advantage']}`: same gradient)"),
        ("loss", f"`loss_type={d['loss_type']}` (token mean over the batch), `epsilon={d['epsilon']}`, "
         f"`epsilon_high={d['epsilon_high']}`, `mask_truncated_completions={d['mask_truncated_completions']}`",
         f"`agg={al['agg']}`, `clip_low={al['clip_low']}`, `clip_high={al['clip_high']}`"),
        ("advantages", f"`scale_rewards={d['scale_rewards']}`: (r - mean) / (std + 1e-4)",
         f"`scale={al['scale']}`: (r - mean) / (std + 1e-6)"),
        ("reference / KL", f"none (`beta={d['beta']}`)", f"none (`kl_coef={al['kl_coef']}`)"),
        ("precision, threads", f"float32 on CPU, torch threads {trl['torch_threads']}, "
         f"{r['env_threads']} reward threads", f"float32, torch threads {ours['torch_threads']}, "
         f"`env_threads={r['env_threads']}`"),
        ("training clock", "from `on_train_begin`, checkpoint saves excluded",
         "`perf/loop_s` (from the loop's start), checkpoint saves excluded"),
    ]
    out = ["| setting | TRL `GRPOConfig` | agentrl config |", "| --- | --- | --- |"]
    out += [f"| {a} | {b} | {c_} |" for a, b, c_ in rows]
    return "\n".join(out)


def plot(reps: list[dict[str, Any]], path: Path, title: str) -> None:
    """Held-out pass@1 vs training wall seconds and vs samples: every repeat's curves (coarse
    and fine points), TRL's best of each repeat dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, key, xlabel in ((axes[0], "wall_s", "training wall seconds"), (axes[1], "samples", "samples (completions)")):
        for r, rep in enumerate(reps):
            alpha = 1.0 if len(reps) == 1 else 0.45 + 0.55 * (r == 0)
            for side, color in (("trl", "tab:orange"), ("ours", "tab:blue")):
                pts = rep["curves"][side]
                ax.errorbar([p[key] for p in pts], [p["pass@1"] for p in pts], yerr=[p["pass@1_se"] for p in pts],
                            marker="o", ms=3, capsize=2, color=color, alpha=alpha,
                            label=f"{LABEL[side]}" + (f", repeat {r + 1}" if len(reps) > 1 else ""))
            ax.axhline(rep["verdict"]["trl_best_pass@1"], ls="--", lw=0.8, color="tab:orange", alpha=0.5)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out pass@1 (± SE); dashed: TRL's best")
    axes[0].legend(loc="lower right", fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def point(name: str, o: dict[str, Any], wall: float, samples: int, step: int, grid: str = "coarse") -> dict[str, Any]:
    """One curve point from an evaluation's `overall` summary."""
    ks = sorted(int(k.split("@")[1]) for k in o if k.startswith("pass@") and not k.endswith("_se"))
    k = ks[-1]
    return {"name": name, "grid": grid, "wall_s": wall, "samples": samples, "step": step, "pass@1": o["pass@1"],
            "pass@1_se": o["pass@1_se"], "k": k, "pass@k": o.get(f"pass@{k}"),
            "pass@k_se": o.get(f"pass@{k}_se"), "tasks": o["tasks"], "episodes": o["episodes"]}


def side_curves(res: dict[str, dict[str, Any]], warm_point: dict[str, Any], warm: Path, tag: str,
                a: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Each side's curve: the warm start, every coarse checkpoint (every `--every-s`), and the
    fine checkpoints (every `--fine-s`) evaluated by `first_reach` near each side's first reach
    of TRL's best (the coarse grid's best)."""
    done: dict[str, dict[int, dict[str, Any]]] = {side: {} for side in SIDES}
    co = {side: coarse_indices(res[side]["checkpoints"], a.every_s) for side in SIDES}

    def getter(side: str) -> Any:
        cks = res[side]["checkpoints"]

        def get(i: int) -> dict[str, Any]:
            if i < 0:
                return warm_point
            if i not in done[side]:
                path = Path(cks[i]["path"])
                o = evaluate(path, warm, path.parent.parent / "eval" / f"{path.name}_{tag}", a)
                done[side][i] = point(path.name, o, cks[i]["wall_s"], cks[i]["samples"], cks[i]["step"],
                                      "coarse" if i in co[side] else "fine")
            return done[side][i]
        return get

    gets = {side: getter(side) for side in SIDES}
    for side in SIDES:
        for i in co[side]:
            gets[side](i)
    best = max([warm_point] + [done["trl"][i] for i in co["trl"]], key=lambda q: q["pass@1"])["pass@1"]
    for side in SIDES:
        if best > warm_point["pass@1"]:
            first_reach(co[side], best, gets[side])
    return {side: [warm_point] + [done[side][i] for i in sorted(done[side])] for side in SIDES}


def run_repeat(r: int, order: list[str], warm: Path, work: Path, cfg: Any, warm_point: dict[str, Any],
               tag: str, a: argparse.Namespace) -> dict[str, Any]:
    """Repeat `r`: both sides trained one after the other in `order` (in WORK/repR), their curves,
    checks, speed and verdict."""
    results: dict[str, dict[str, Any]] = {}
    for side in order:
        if a.reuse and (work / side / "result.json").exists():
            results[side] = json.loads((work / side / "result.json").read_text())
            print(f"[{side}] reusing {work / side}", flush=True)
        else:
            print(f"[repeat {r}] {side}", flush=True)
            results[side] = run_side(side, warm, work, a)
    curves = side_curves(results, warm_point, warm, tag, a)
    checks = {"prompt_ids": results["trl"]["prompt_check"],
              "rewards": reward_check(cfg, results["trl"].get("recorded", [])),
              "task_seeds": seed_check(cfg, results)}
    pc, rc = checks["prompt_ids"], checks["rewards"]
    lines = [f"prompt ids: {pc['checked'] - pc['different']}/{pc['checked']} TRL prompts equal agentrl's "
             "`ChatRenderer.prompt_ids`",
             f"rewards: {rc['checked'] - rc['different']}/{rc['checked']} TRL rewards (its first steps' "
             f"answers, {rc['passing']} passing) equal the env's `step` reward"]
    for side, sc in checks["task_seeds"].items():
        lines.append(f"task seeds, {LABEL[side]}: {sc['steps'] - sc['different']}/{sc['steps']} steps on "
                     "agentrl's per-step seeds")
    for side, res in results.items():
        if res.get("ran_out_of_rows"):
            lines.append(f"WARNING: {LABEL[side]} used all {res['max_steps']} prepared steps before the "
                         "budget (raise --max-steps)")
    for line in lines:
        print(f"[check] {line}", flush=True)
    speed = {s: {"steps": results[s]["steps_done"],
                 "s_per_step": results[s]["checkpoints"][-1]["wall_s"] / max(results[s]["checkpoints"][-1]["step"], 1),
                 "peak_rss_mb": results[s]["peak_rss_mb"]} for s in SIDES}
    v = verdict(curves)
    print(f"[repeat {r}] {verdict_text(v)}", flush=True)
    return {"repeat": r, "order": order, "curves": curves, "verdict": v, "checks": checks, "check_lines": lines,
            "speed": speed, "results": results,
            "runs": {s: {k: val for k, val in res.items() if k not in ("recorded", "step_seeds", "config")}
                     for s, res in results.items()}}


def step_profile(steps: list[dict[str, Any]]) -> dict[str, float] | None:
    """agentrl's mean seconds per step in generation, the env (the sandbox) and the update, and
    the share of env steps the verdict cache answered, from the worker's per-step records
    (`learning_vs_trl_ours`: `perf/generate_s`, `perf/env_s`, `perf/update_s`, `sandbox/cached`
    over `episodes`); None for records without them (runs before they were recorded)."""
    rows = [r for r in steps if "env_s" in r]
    if not rows:
        return None
    mean = {k: sum(float(r[k]) for r in rows) / len(rows) for k in ("generate_s", "env_s", "update_s")}
    mean["cached_share"] = float(sum(r["cached"] for r in rows) / max(sum(r["episodes"] for r in rows), 1))
    return mean


def profile_text(p: dict[str, float] | None) -> str:
    """One line of `step_profile`."""
    if p is None:
        return "agentrl's step profile: not recorded"
    return (f"agentrl per step: generation {p['generate_s']:.2f} s, env (sandbox) {p['env_s']:.2f} s, update "
            f"{p['update_s']:.2f} s; the verdict cache answered {p['cached_share']:.0%} of the env steps")


def repeats_table(reps: list[dict[str, Any]]) -> str:
    """One row per repeat: order, TRL's best and when each side reached it, the ratio, the
    per-sample difference, steps and s/step, and the loads."""
    lines = ["| repeat | trained first | TRL's best pass@1 | TRL reached it | agentrl reached it | time ratio | "
             "per sample agentrl - TRL | steps (s/step) TRL / agentrl | load avg TRL / agentrl |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for rep in reps:
        v, sp, runs = rep["verdict"], rep["speed"], rep["runs"]
        ratio = "-" if v["time_ratio"] is None else f"{v['time_ratio']:.3f}x"
        ours = "never" if v["ours_reach_wall_s"] is None else f"{v['ours_reach_wall_s']:.0f} s"
        diff = "-" if v["per_sample_mean_diff"] is None else f"{v['per_sample_mean_diff']:+.3f} ± {v['per_sample_se']:.3f}"
        load = " / ".join(f"{runs[s]['loadavg_before'][0]:.1f}->{runs[s]['loadavg_after'][0]:.1f}"
                          if "loadavg_before" in runs[s] else "-" for s in SIDES)
        lines.append(f"| {rep['repeat']} | {LABEL[rep['order'][0]]} | {v['trl_best_pass@1']:.3f} ± {v['trl_best_se']:.3f} "
                     f"(at {v['trl_best_wall_s']:.0f} s) | {v['trl_reach_wall_s']:.0f} s | {ours} | {ratio} | {diff} | "
                     + " / ".join(f"{sp[s]['steps']} ({sp[s]['s_per_step']:.2f})" for s in SIDES) + f" | {load} |")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=360, help="training wall seconds per side")
    ap.add_argument("--every-s", type=float, default=30, help="the coarse grid: checkpoints evaluated on every side")
    ap.add_argument("--fine-s", type=float, default=10,
                    help="the fine grid: checkpoints saved every FINE_S s, evaluated only near the crossing")
    ap.add_argument("--repeats", type=int, default=3, help="the comparison repeated N times, the side trained "
                    "first alternating")
    ap.add_argument("--eval-tasks", type=int, default=None,
                    help="held-out tasks per evaluation (default: the run's train.eval_tasks, 256)")
    ap.add_argument("--eval-samples", type=int, default=None,
                    help="samples per task (default: the run's train.eval_samples, 4)")
    ap.add_argument("--work", default="runs/learning_vs_trl", help="warm start, checkpoints, evaluations")
    ap.add_argument("--order", default="trl,ours", help="which side trains first in repeat 1 (one at a time; "
                    "the other in repeat 2, and so on)")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="steps prepared per side (default budget_s / 0.5 + 10; a side that runs out stops early)")
    ap.add_argument("--warm-args", nargs="*", default=[],
                    help="extra key=value overrides for the warm-start build (e.g. for a quick smoke run)")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse the training runs already in --work (and their evaluations)")
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "learning_vs_trl.json"))
    ap.add_argument("--md", default=str(ROOT / "benchmarks" / "results" / "learning_vs_trl.md"))
    ap.add_argument("--png", default=str(ROOT / "docs" / "learning_vs_trl.png"))
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed beyond the budget per run")
    a = ap.parse_args(argv)
    order = a.order.split(",")
    if sorted(order) != sorted(SIDES):
        raise ValueError(f"--order must name both sides {SIDES}, got {a.order!r}")
    if a.every_s % a.fine_s:
        raise ValueError(f"--every-s ({a.every_s}) must be a multiple of --fine-s ({a.fine_s})")
    if a.max_steps is None:
        a.max_steps = int(a.budget_s / 0.5) + 10
    os.environ.update(worker_env())  # this process evaluates: 1 thread, offline
    t_start = time.perf_counter()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    warm = build_warm(work, a.warm_args, a.timeout)
    from learning_vs_trl_common import run_config

    cfg = run_config(warm)
    import torch

    torch.set_num_threads(1)
    tag = eval_tag(a, cfg)
    warm_point = point("warm start", evaluate(warm / "sft_model", warm, work / "eval" / f"warm_{tag}", a), 0.0, 0, 0)
    reps = [run_repeat(r + 1, order if r % 2 == 0 else order[::-1], warm, work / f"rep{r + 1}", cfg, warm_point,
                       tag, a) for r in range(a.repeats)]
    s = summary([rep["verdict"] for rep in reps])
    st = summary_text(s)
    first = reps[0]["results"]
    settings = settings_table(cfg, first["trl"], first["ours"], reps[0]["checks"])
    rtable = repeats_table(reps)
    print("\n" + settings + "\n\n" + rtable + "\n\n" + st, flush=True)
    versions = first["trl"].get("versions", {})
    commits = sorted({rep["results"][side].get("commit", "unrecorded") for rep in reps for side in SIDES})
    header = (f"Budget {a.budget_s:.0f} s of training per side, {a.repeats} repeats (the side trained first "
              f"alternating), checkpoints every {a.fine_s:.0f} s, those every {a.every_s:.0f} s evaluated on every "
              f"side and the {a.fine_s:.0f} s ones near each side's first reach of TRL's best; held-out evaluation "
              f"{tag} (tasks x samples) at T={cfg.rollout.temperature}, seed {cfg.seed}; trl {versions.get('trl')}, "
              f"transformers {versions.get('transformers')}, torch {versions.get('torch')}; {os.cpu_count()} cores; "
              f"trained at commit(s) {', '.join(f'`{c}`' for c in commits)}; written by "
              f"benchmarks/learning_vs_trl.py on {time.strftime('%Y-%m-%d %H:%M')}.")
    parts = ["# Learning: agentrl vs TRL GRPOTrainer (main job)", header, "## Settings", settings,
             "## Repeats", rtable, "## Verdict", st]
    for rep in reps:
        parts += [f"## Repeat {rep['repeat']} ({LABEL[rep['order'][0]]} first)", curves_table(rep["curves"]),
                  "; ".join(f"{LABEL[x]}: {rep['speed'][x]['steps']} steps, {rep['speed'][x]['s_per_step']:.2f} "
                            f"s/step, peak RSS {rep['speed'][x]['peak_rss_mb']:.0f} MB" for x in SIDES),
                  profile_text(step_profile(rep["results"]["ours"].get("train_rewards", []))),
                  "\n".join(f"- {ln}" for ln in rep["check_lines"]), verdict_text(rep["verdict"])]
    md = "\n\n".join(parts) + "\n"
    out = {"args": vars(a), "settings_table": settings, "repeats_table": rtable, "summary": s, "summary_text": st,
           "repeats": [{k: val for k, val in rep.items() if k != "results"} for rep in reps],
           "versions": versions, "header": header, "config": first["ours"].get("config"),
           "wall_s": time.perf_counter() - t_start}
    for path, text in ((a.json, json.dumps(out, indent=1)), (a.md, md)):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
    if a.png:
        plot(reps, Path(a.png), f"code_sandbox main job, {a.budget_s:.0f} s of training per side, "
                                f"{a.repeats} repeats, held-out {tag}")
    print(f"[done] {a.json} {a.md} {a.png} ({out['wall_s']:.0f} s)", flush=True)
    return out


if __name__ == "__main__":
    main()
