"""Learning, not speed: TRL's GRPOTrainer vs agentrl on the main job, same wall-clock budget.

    pip install -e '.[bench,log]'                  # TRL (trl>=1.16); matplotlib (log extra) for the PNG
    python benchmarks/learning_vs_trl.py           # 360 s of training per side, a checkpoint every 30 s
    python benchmarks/learning_vs_trl.py --budget-s 40 --every-s 20 --eval-tasks 16   # smoke run
    python benchmarks/learning_vs_trl.py --reuse   # re-evaluate / re-plot the runs already in --work

About 25 minutes with the defaults on 2 cores (1506 s measured): the warm start (~3 min, once;
reused from `--work` afterwards), 2 x (360 s + set-up), then 25 evaluations of 256 tasks x 4
samples (~25 s each). Nothing else should run on the machine meanwhile (the figure is wall time).

What it does (benchmarks/README.md has the settings table):

1. Warm start, once: `python -m agentrl.cli train --env code_sandbox --algo grpo --steps 0
   --out WORK/warm --quiet` (the embedded tiny model + tokenizer and the supervised warm start;
   WORK/warm/sft_model is the starting point of both sides, WORK/warm/config.json the run config).
2. Trains each side ONE AT A TIME, each in its own process (OMP/torch threads 1, offline), for
   `--budget-s` seconds of training wall clock, saving the policy at the first step end after
   every `--every-s` seconds and at the budget; the save time is not counted. TRL:
   `learning_vs_trl_trl.py` (GRPOTrainer, clock from `on_train_begin`); agentrl:
   `learning_vs_trl_ours.py` (`agentrl.train.train`, clock `perf/loop_s`). Same training tasks
   in the same order (the seeds agentrl's `run_batch` draws per step, as TRL dataset rows), same
   reward (the code_sandbox env's extraction and sandbox verdict), same group size, tasks per
   step, temperature, max tokens, learning rate and loss settings as far as TRL allows.
3. Evaluates the warm start (t = 0) and every checkpoint with agentrl's evaluation harness
   (`agentrl.eval.cli.eval_command`, the `agentrl eval --model CKPT -c WORK/warm/config.json`
   of the CLI): the run's held-out evaluation (first `train.eval_tasks` = 256 tasks of the
   held-out list x `train.eval_samples` = 4, T = 1, the run's seed); `--eval-tasks` cuts it.
4. Checks (printed and in the JSON): TRL's tokenized prompts equal agentrl's
   `ChatRenderer.prompt_ids` (first 1024 rows); TRL's rewards of its first 2 steps' answers
   equal the env's own `step` rewards; both sides trained on the tasks of the same seeds.
5. Writes `--json` (benchmarks/results/learning_vs_trl.json), `--md` (the settings and results
   tables and the verdict, benchmarks/results/learning_vs_trl.md) and `--png`
   (docs/learning_vs_trl.png: held-out pass@1 vs training wall seconds and vs samples), and
   prints the verdict against the target "agentrl reaches TRL's best held-out pass@1 in at most
   half TRL's wall time, and is not worse per sample".

Verdict: TRL's best pass@1 over its curve (warm start included) and the time of that
checkpoint; the first agentrl checkpoint with pass@1 >= that, and its time over TRL's (target
<= 0.5). Per sample: agentrl's curve linearly interpolated at each TRL checkpoint's sample
count (within agentrl's range); "not worse" when the mean difference agentrl - TRL is above
-2 standard errors (the evaluations' standard errors over tasks, taken as independent); the
strict reading (mean difference >= 0) is printed too.
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
from vs_trl import worker_env  # noqa: E402  (the speed benchmark's offline, 1-thread environment)

SIDES = ("trl", "ours")
LABEL = {"trl": "TRL GRPOTrainer", "ours": "agentrl"}
TARGET_TIME_RATIO = 0.5


# -- running ------------------------------------------------------------------------------------
def git_commit() -> str:
    """The short hash of HEAD, `+dirty` when tracked files other than this benchmark's outputs
    differ from it ("unknown" outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", ":!benchmarks/results",
                                ":!docs/learning_vs_trl.png"], cwd=HERE.parent).returncode != 0
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


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
    """Train one side in its own process (nothing else of ours runs meanwhile); its result."""
    out = work / side
    shutil.rmtree(out, ignore_errors=True)  # its checkpoints and their evaluations
    out.mkdir(parents=True)
    script = HERE / f"learning_vs_trl_{side}.py"
    cmd = [sys.executable, str(script), "--warm", str(warm), "--out", str(out), "--budget-s",
           str(a.budget_s), "--every-s", str(a.every_s), "--max-steps", str(a.max_steps)]
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
    res["commit"] = git_commit()
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


def verdict(curves: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The target's two parts from the curves (lists of points `wall_s`, `samples`, `pass@1`,
    `pass@1_se`, in time order, the warm start first)."""
    trl, ours = curves["trl"], curves["ours"]
    best = max(trl, key=lambda p: p["pass@1"])  # the first of equal maxima: the earliest
    reach = next((p for p in ours if p["pass@1"] >= best["pass@1"]), None)
    v: dict[str, Any] = {"trl_best_pass@1": best["pass@1"], "trl_best_se": best["pass@1_se"],
                         "trl_best_wall_s": best["wall_s"], "trl_best_samples": best["samples"],
                         "ours_best_pass@1": max(p["pass@1"] for p in ours),
                         "ours_reach_wall_s": reach["wall_s"] if reach else None,
                         "ours_reach_samples": reach["samples"] if reach else None}
    if best["wall_s"] <= 0:
        v.update(time_ratio=None, time_met=None,
                 time_note="TRL never rose above the warm start: the time part is undefined")
    elif reach is None:
        v.update(time_ratio=None, time_met=False, time_note="agentrl never reached TRL's best")
    else:
        v["time_ratio"] = reach["wall_s"] / best["wall_s"]
        v["time_met"] = v["time_ratio"] <= TARGET_TIME_RATIO
        v["time_note"] = (f"agentrl reached {best['pass@1']:.3f} at {reach['wall_s']:.0f} s, TRL at "
                          f"{best['wall_s']:.0f} s: {v['time_ratio']:.3f}x TRL's time (target <= {TARGET_TIME_RATIO})")
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
        v.update(per_sample_mean_diff=d, per_sample_se=se, per_sample_met=d > -2 * se,
                 per_sample_strict=d >= 0,
                 per_sample_note=(f"agentrl - TRL at {len(matched)} matched sample counts: mean "
                                  f"{d:+.3f} ± {se:.3f} (not worse: > -2 SE; strict: >= 0)"))
    else:
        v.update(per_sample_mean_diff=None, per_sample_se=None, per_sample_met=None, per_sample_strict=None,
                 per_sample_note="no TRL checkpoint within agentrl's sample range")
    parts = [v["time_met"], v["per_sample_met"]]
    v["met"] = None if None in parts else all(parts)
    return v


def verdict_text(v: dict[str, Any]) -> str:
    word = {True: "MET", False: "NOT met", None: "undetermined"}
    return (f"Target: agentrl reaches TRL's best held-out pass@1 in at most half TRL's wall time, and is "
            f"not worse per sample -> {word[v['met']]}.\n"
            f"- time: TRL's best pass@1 {v['trl_best_pass@1']:.3f} ± {v['trl_best_se']:.3f} at "
            f"{v['trl_best_wall_s']:.0f} s ({v['trl_best_samples']} samples); {v['time_note']} -> {word[v['time_met']]}\n"
            f"- per sample: {v['per_sample_note']} -> {word[v['per_sample_met']]}"
            + ("" if v["per_sample_strict"] is None else f" (strict: {word[v['per_sample_strict']]})"))


def curves_table(curves: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["| side | checkpoint | training wall s | samples | steps | held-out pass@1 ± SE | pass@k ± SE |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for side in SIDES:
        for p in curves[side]:
            pk = f"{p['pass@k']:.3f} ± {p['pass@k_se']:.3f} (k={p['k']})" if p.get("pass@k") is not None else "-"
            lines.append(f"| {LABEL[side]} | {p['name']} | {p['wall_s']:.0f} | {p['samples']} | {p['step']} | "
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
        ("reward", "env's `extract_code` + `sandbox_job` + sandbox pool on the answer decoded as agentrl decodes it",
         f"the env's `step` (`reward={c['env']['kwargs'].get('reward', 'binary')}`)"),
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


def plot(curves: dict[str, list[dict[str, Any]]], v: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, key, xlabel in ((axes[0], "wall_s", "training wall seconds"), (axes[1], "samples", "samples (completions)")):
        for side, color in (("trl", "tab:orange"), ("ours", "tab:blue")):
            pts = curves[side]
            ax.errorbar([p[key] for p in pts], [p["pass@1"] for p in pts], yerr=[p["pass@1_se"] for p in pts],
                        marker="o", ms=4, capsize=3, color=color, label=LABEL[side])
        ax.axhline(v["trl_best_pass@1"], ls="--", lw=0.8, color="tab:orange", alpha=0.6, label="TRL's best")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out pass@1 (± SE)")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=360, help="training wall seconds per side")
    ap.add_argument("--every-s", type=float, default=30, help="checkpoint interval, training wall seconds")
    ap.add_argument("--eval-tasks", type=int, default=None,
                    help="held-out tasks per evaluation (default: the run's train.eval_tasks, 256)")
    ap.add_argument("--eval-samples", type=int, default=None,
                    help="samples per task (default: the run's train.eval_samples, 4)")
    ap.add_argument("--work", default="runs/learning_vs_trl", help="warm start, checkpoints, evaluations")
    ap.add_argument("--order", default="trl,ours", help="which side trains first (one at a time)")
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
    if a.max_steps is None:
        a.max_steps = int(a.budget_s / 0.5) + 10
    os.environ.update(worker_env())  # this process evaluates: 1 thread, offline
    t_start = time.perf_counter()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    warm = build_warm(work, a.warm_args, a.timeout)
    from learning_vs_trl_common import run_config

    cfg = run_config(warm)
    results: dict[str, dict[str, Any]] = {}
    for side in a.order.split(","):
        if a.reuse and (work / side / "result.json").exists():
            results[side] = json.loads((work / side / "result.json").read_text())
            print(f"[{side}] reusing {work / side}", flush=True)
        else:
            results[side] = run_side(side, warm, work, a)
    if set(results) != set(SIDES):
        raise ValueError(f"--order must name both sides {SIDES}, got {a.order!r}")

    import torch

    torch.set_num_threads(1)
    tag = eval_tag(a, cfg)
    w = evaluate(warm / "sft_model", warm, work / "eval" / f"warm_{tag}", a)
    curves: dict[str, list[dict[str, Any]]] = {}

    def point(name: str, o: dict[str, Any], wall: float, samples: int, step: int) -> dict[str, Any]:
        ks = sorted(int(k.split("@")[1]) for k in o if k.startswith("pass@") and not k.endswith("_se"))
        k = ks[-1]
        return {"name": name, "wall_s": wall, "samples": samples, "step": step, "pass@1": o["pass@1"],
                "pass@1_se": o["pass@1_se"], "k": k, "pass@k": o.get(f"pass@{k}"),
                "pass@k_se": o.get(f"pass@{k}_se"), "tasks": o["tasks"], "episodes": o["episodes"]}

    for side in SIDES:
        curves[side] = [point("warm start", w, 0.0, 0, 0)]
        for ck in results[side]["checkpoints"]:
            path = Path(ck["path"])
            o = evaluate(path, warm, work / side / "eval" / f"{path.name}_{tag}", a)
            curves[side].append(point(path.name, o, ck["wall_s"], ck["samples"], ck["step"]))

    checks = {"prompt_ids": results["trl"]["prompt_check"],
              "rewards": reward_check(cfg, results["trl"].get("recorded", [])),
              "task_seeds": seed_check(cfg, results)}
    pc, rc = checks["prompt_ids"], checks["rewards"]
    check_lines = [f"prompt ids: {pc['checked'] - pc['different']}/{pc['checked']} TRL prompts equal agentrl's "
                   "`ChatRenderer.prompt_ids`",
                   f"rewards: {rc['checked'] - rc['different']}/{rc['checked']} TRL rewards (its first steps' "
                   f"answers, {rc['passing']} passing) equal the env's `step` reward"]
    for side, s in checks["task_seeds"].items():
        check_lines.append(f"task seeds, {LABEL[side]}: {s['steps'] - s['different']}/{s['steps']} steps on "
                           "agentrl's per-step seeds")
    for side, r in results.items():
        if r.get("ran_out_of_rows"):
            check_lines.append(f"WARNING: {LABEL[side]} used all {r['max_steps']} prepared steps before the "
                               "budget (raise --max-steps)")
    for line in check_lines:
        print(f"[check] {line}", flush=True)
    v = verdict(curves)
    settings = settings_table(cfg, results["trl"], results["ours"], checks)
    table = curves_table(curves)
    vt = verdict_text(v)
    speed = {s: {"steps": results[s]["steps_done"],
                 "s_per_step": results[s]["checkpoints"][-1]["wall_s"] / max(results[s]["checkpoints"][-1]["step"], 1),
                 "peak_rss_mb": results[s]["peak_rss_mb"]} for s in SIDES}
    speed_line = "; ".join(f"{LABEL[s]}: {speed[s]['steps']} steps, {speed[s]['s_per_step']:.2f} s/step, "
                           f"peak RSS {speed[s]['peak_rss_mb']:.0f} MB" for s in SIDES)
    print("\n" + settings + "\n\n" + table + "\n\n" + speed_line + "\n\n" + vt, flush=True)
    versions = results["trl"].get("versions", {})
    header = (f"Budget {a.budget_s:.0f} s of training per side, a checkpoint every {a.every_s:.0f} s; "
              f"held-out evaluation {tag} (tasks x samples) at T={cfg.rollout.temperature}, seed {cfg.seed}; "
              f"trl {versions.get('trl')}, transformers {versions.get('transformers')}, torch {versions.get('torch')}; "
              f"{os.cpu_count()} cores; written by benchmarks/learning_vs_trl.py on {time.strftime('%Y-%m-%d %H:%M')}. "
              + "; ".join(f"{LABEL[s]} trained at commit `{results[s].get('commit', 'unrecorded')}`, "
                          f"1-min load average {results[s]['loadavg_before'][0]:.1f} -> "
                          f"{results[s]['loadavg_after'][0]:.1f}" for s in SIDES) + ".")
    md = "\n\n".join(["# Learning: agentrl vs TRL GRPOTrainer (main job)", header, "## Settings", settings,
                      "## Held-out pass@1", table, speed_line, "## Checks",
                      "\n".join(f"- {ln}" for ln in check_lines), "## Verdict", vt]) + "\n"
    out = {"args": vars(a), "settings_table": settings, "table": table, "verdict": v, "verdict_text": vt,
           "curves": curves, "checks": checks, "speed": speed, "versions": versions, "header": header,
           "runs": {s: {k: val for k, val in r.items() if k not in ("recorded", "step_seeds", "config")}
                    for s, r in results.items()},
           "config": results["ours"].get("config"), "wall_s": time.perf_counter() - t_start}
    for path, text in ((a.json, json.dumps(out, indent=1)), (a.md, md)):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
    if a.png:
        plot(curves, v, Path(a.png), f"code_sandbox main job, {a.budget_s:.0f} s of training per side, "
                                     f"held-out {tag}")
    print(f"[done] {a.json} {a.md} {a.png} ({out['wall_s']:.0f} s)", flush=True)
    return out


if __name__ == "__main__":
    main()
