"""On-policy distillation on the code env (issue #24): a trained checkpoint teaches the untrained
embedded model. Held-out pass@1 of the student before and after `--algo distill`, and of the
teacher, on the same held-out tasks.

    PYTHONPATH=. python benchmarks/distill_code_env.py            # the defaults below, <= 12 min
    PYTHONPATH=. python benchmarks/distill_code_env.py --student-steps 60 --tag short
    PYTHONPATH=. python benchmarks/distill_code_env.py --distill-kl full --work W --tag full
    PYTHONPATH=. python benchmarks/distill_code_env.py --distill-kl forward --work W --reuse-teacher --tag fwd
    PYTHONPATH=. python benchmarks/distill_code_env.py --distill-kl forward --teacher-fraction 0.5 \
        --student-lr 2e-3 --student-steps 400 --work W --reuse-teacher --tag gkd   # GKD's mixture

`--distill-kl` is the student's `algo.distill_kl` (sampled: the default one-sample signal; full,
topk, forward: the exact per-token KL over the vocabulary, docs/algos.md); `--reuse-teacher`
takes the teacher an earlier run trained in the same `--work` folder instead of training it again;
`--teacher-fraction` is the student's `algo.distill_teacher_fraction` (GKD's mixture: that share of
each step's tasks is played by the teacher, its own samples scored by the same token-level KL).

Two `agentrl train` runs, each a subprocess as a user runs it (in-process engine, no Ray):

1. the teacher: a short main job, `--env code_sandbox --algo grpo --steps TEACHER_STEPS` with its
   defaults (the embedded model built in TEACHER/base_model, the SFT warm start, GRPO). Its
   held-out evaluation after RL is the teacher's pass@1; its last checkpoint is the teacher.
2. the student: `--algo distill algo.teacher_path=<that checkpoint>` from TEACHER/base_model, the
   same untrained embedded model the teacher started from (the same tokenizer), with no warm
   start (`sft.steps=0`) and no env reward in the advantage (`algo.distill_reward_coef=0`, the
   default): the student learns only from the teacher's per-token log-probabilities of its own
   samples. Its held-out evaluations before and after are the student's figures.

Both runs have the same seed and `train.eval_tasks`, so they evaluate the same held-out tasks
with the same sampling seeds. Writes benchmarks/results/distill_code_env.json (under `--tag`,
default `default`, beside earlier tags) and prints the figures. Single seed, one run: a figure
from it says what this run did, not what the method does on average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "distill_code_env.json"

TEACHER_STEPS = 40
"""GRPO steps of the teacher's short main job (after its SFT warm start)."""
STUDENT_STEPS = 100
"""Distillation steps of the student."""
STUDENT_LR = 5e-4
"""The student's learning rate. Tried on this machine (untrained student, 64 episodes a step):
2e-3 and 1e-3 made the reverse KL rise within 20 steps; 5e-4 lowered it for ~15 steps."""
STUDENT_BATCH = ("rollout.tasks_per_step=32", "algo.group_size=2")
"""64 episodes a step (the main job's 128 take ~25 s a step for an untrained student, which
samples all `max_tokens` of every turn); without the env reward, groups are not needed."""
GKD = {"distill_kl": "forward", "teacher_fraction": 0.5, "student_lr": 2e-3, "student_steps": 300}
"""GKD's mixture as the learning test (`tests/e2e/test_distill_code_env.py`) runs it: half of each
step's tasks played by the teacher, the forward KL on both kinds of rows, the SFT warm start's lr
(2e-3), 300 steps. Measured at 03a70ff (tag `gkd_forward_f0.5_lr2e-3_400steps`, held-out
evaluations every 100 steps): student pass@1 0.000, 0.000, 0.027, 0.311, 0.307 at steps 0-400;
without the mixture (teacher_fraction 0, tag `forward_f0_lr2e-3_300steps`) 0.000, 0.000, 0.049,
0.270 at steps 0-300."""
EVAL_TASKS = 128
"""Held-out tasks of each evaluation (x `train.eval_samples`, 4)."""


def _train(args: list[str], out: Path) -> tuple[dict[str, Any], float]:
    """`agentrl train ARGS --out OUT` in a subprocess; its summary.json and wall seconds.

    Raises:
        RuntimeError: the run failed (the end of its output is in the message).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "code_sandbox", "--out", str(out),
           "--overwrite", "--quiet", *args]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (out.parent / f"{out.name}.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:])} failed (rc {r.returncode}):\n"
                           f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return json.loads((out / "summary.json").read_text()), wall


def _pass(e: dict[str, Any]) -> dict[str, float]:
    k = max(int(key.split("@")[1].split("_")[0]) for key in e if key.startswith("pass@"))
    return {"pass@1": e["pass@1"], "pass@1_se": e["pass@1_se"], f"pass@{k}": e[f"pass@{k}"]}


def run(work: Path, *, teacher_steps: int = TEACHER_STEPS, student_steps: int = STUDENT_STEPS,
        student_lr: float = STUDENT_LR, eval_tasks: int = EVAL_TASKS, seed: int = 0,
        distill_kl: str = "sampled", student_overrides: tuple[str, ...] = (),
        reuse_teacher: bool = False, teacher_fraction: float = 0.0) -> dict[str, Any]:
    """The teacher's short main job, then the student's distillation (`algo.distill_kl=distill_kl`),
    in `work`. `reuse_teacher`: take the teacher of an earlier run in the same `work` (its
    summary.json, checkpoint and base model) instead of training it again. `teacher_fraction`:
    the student's `algo.distill_teacher_fraction` (GKD's mixture: that share of each step's
    tasks is played by the teacher; 0: pure on-policy distillation).

    Returns:
        `teacher` (its pass@1 after the warm start and after GRPO: the teacher's figure),
        `student_before` / `student_after` (held-out pass@1, its standard error, pass@4),
        `reverse_kl_first` / `_last` (mean over the first / last 5 steps of `adv/reverse_kl`,
        nats per agent token), the settings and wall seconds of each run.
    """
    common = [f"seed={seed}", f"train.eval_tasks={eval_tasks}", "train.log_rollouts_every=0",
              "log.tensorboard=false"]
    if reuse_teacher and (work / "teacher" / "summary.json").exists():
        teacher = json.loads((work / "teacher" / "summary.json").read_text())
        t_wall = float(json.loads((work / "teacher_wall_s.json").read_text()))
    else:
        teacher, t_wall = _train(["--algo", "grpo", "--steps", str(teacher_steps), *common], work / "teacher")
        (work / "teacher_wall_s.json").write_text(json.dumps(t_wall))
    base = work / "teacher" / "base_model"
    student_args = ["--algo", "distill", "--steps", str(student_steps), f"model.path={base}",
                    f"algo.teacher_path={teacher['checkpoint']}", "sft.steps=0",
                    f"train.lr={student_lr}", f"algo.distill_kl={distill_kl}", *STUDENT_BATCH, *common,
                    *([f"algo.distill_teacher_fraction={teacher_fraction}"] if teacher_fraction else []),
                    *student_overrides]
    student, s_wall = _train(student_args, work / "student")
    rows = [json.loads(line) for line in (work / "student" / "metrics.jsonl").open()]
    kl = [r["adv/reverse_kl"] for r in rows if "adv/reverse_kl" in r]
    dk = [v for r in rows for k, v in r.items() if k.endswith("distill_kl")]
    # the student's own episodes (with the mixture, reward_mean is over both samplers')
    key = "rollout/student_reward_mean" if teacher_fraction else "rollout/reward_mean"
    rewards = [r[key] for r in rows if key in r]
    t_rewards = [r["rollout/teacher_reward_mean"] for r in rows if "rollout/teacher_reward_mean" in r]
    gaps = [r["rollout/teacher_sampler_gap"] for r in rows if "rollout/teacher_sampler_gap" in r]
    return {
        "teacher": {"after_warm_start": _pass(teacher["eval_before"]), "final": _pass(teacher["eval_after"]),
                    "grpo_steps": teacher_steps, "sft_steps": teacher.get("sft_steps"), "wall_s": round(t_wall, 1)},
        "student_before": _pass(student["eval_before"]),
        "student_after": _pass(student["eval_after"]),
        "student": {"distill_steps": student_steps, "lr": student_lr, "distill_kl": distill_kl,
                    "teacher_fraction": teacher_fraction,
                    "wall_s": round(s_wall, 1), "overrides": list(student_overrides)},
        "distill_kl_first": sum(dk[:5]) / max(len(dk[:5]), 1) if dk else None,
        "distill_kl_last": sum(dk[-5:]) / max(len(dk[-5:]), 1) if dk else None,
        "reverse_kl_first": sum(kl[:5]) / max(len(kl[:5]), 1),
        "reverse_kl_last": sum(kl[-5:]) / max(len(kl[-5:]), 1),
        "train_reward_first": sum(rewards[:5]) / max(len(rewards[:5]), 1),
        "train_reward_last": sum(rewards[-5:]) / max(len(rewards[-5:]), 1),
        **({"teacher_rows_reward_mean": sum(t_rewards) / len(t_rewards),
            "teacher_sampler_gap_max": max(gaps) if gaps else None} if t_rewards else {}),
        "eval_tasks": eval_tasks, "seed": seed,
    }


def commit() -> str:
    """The checkout's short commit, `+dirty` when tracked files differ from it."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "agentrl", "envs",
                            "benchmarks/distill_code_env.py"]).returncode != 0
    return head + ("+dirty" if dirty else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--teacher-steps", type=int, default=TEACHER_STEPS)
    ap.add_argument("--student-steps", type=int, default=STUDENT_STEPS)
    ap.add_argument("--student-lr", type=float, default=STUDENT_LR)
    ap.add_argument("--eval-tasks", type=int, default=EVAL_TASKS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--distill-kl", default="sampled", choices=("sampled", "full", "topk", "forward"),
                    help="the student's algo.distill_kl (docs/algorithms.md)")
    ap.add_argument("--teacher-fraction", type=float, default=0.0,
                    help="the student's algo.distill_teacher_fraction (GKD's mixture; needs "
                         "--distill-kl full|topk|forward)")
    ap.add_argument("--reuse-teacher", action="store_true",
                    help="with --work: take the teacher trained by an earlier run there")
    ap.add_argument("--tag", default="default")
    ap.add_argument("--work", default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides of the student's run")
    a = ap.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        res = run(work, teacher_steps=a.teacher_steps, student_steps=a.student_steps,
                  student_lr=a.student_lr, eval_tasks=a.eval_tasks, seed=a.seed,
                  distill_kl=a.distill_kl, student_overrides=tuple(a.overrides),
                  reuse_teacher=a.reuse_teacher, teacher_fraction=a.teacher_fraction)
    res.update({"commit": commit(), "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.perf_counter() - t0, 1),
                "load_avg_1m_at_end": os.getloadavg()[0]})
    allres = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    allres[a.tag] = res
    RESULTS.write_text(json.dumps(allres, indent=1) + "\n")
    t, b, f = res["teacher"]["final"], res["student_before"], res["student_after"]
    print(json.dumps(res, indent=1))
    print(f"held-out pass@1 ({a.eval_tasks} tasks x 4 samples): student {b['pass@1']:.3f} -> {f['pass@1']:.3f} "
          f"(se {b['pass@1_se']:.3f}, {f['pass@1_se']:.3f}); teacher {t['pass@1']:.3f} (se {t['pass@1_se']:.3f}); "
          f"reverse KL {res['reverse_kl_first']:.3f} -> {res['reverse_kl_last']:.3f} nats/token; "
          f"{res['wall_s'] / 60:.1f} min at {res['commit']}")


if __name__ == "__main__":
    main()
