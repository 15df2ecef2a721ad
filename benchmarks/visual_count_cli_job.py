"""What `agentrl train --env visual_count --algo grpo` does, with the blank / shuffled controls.

Runs the CLI job as a subprocess (`agentrl train --env visual_count --algo grpo --out OUT`
plus the given overrides, e.g. `--steps 20` where the default 360 steps do not fit in the
time), then evaluates its warm-start model (OUT/sft_model) and its last checkpoint on the first
`--eval-tasks` held-out tasks greedily, with the task's own board (`real`), an empty board
(`blank`) and another task's board (`shuffled`), as `visual_count_learning.py` does, and the
paired change from the warm start to the last checkpoint over the same tasks. The run's own
held-out evaluation (pass@1 at temperature `rollout.temperature`, `train.eval_samples`
samples per task) is copied from its summary.

    PYTHONPATH=. python benchmarks/visual_count_cli_job.py --out-run /tmp/vc --steps 20 \\
        [--questions colour] [-- extra overrides key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from visual_count_learning import (  # noqa: E402
    CONDITIONS,
    blind_baselines,
    evaluate,
    git_commit,
    heldout_cases,
    paired_change,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-run", required=True, help="the run's --out (overwritten)")
    ap.add_argument("--steps", type=int, default=None, help="--steps of the job (default: the config's)")
    ap.add_argument("--questions", default=None,
                    help="comma-separated env questions (env.kwargs.questions; default: the env's own)")
    ap.add_argument("--eval-tasks", type=int, default=256)
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides of the job")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from agentrl.models.vlm import load_vlm
    from agentrl_envs.visual_count import QUESTIONS

    questions = a.questions.split(",") if a.questions else list(QUESTIONS)
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "visual_count", "--algo", "grpo",
           "--out", a.out_run, "--overwrite", "--quiet"]
    if a.steps is not None:
        cmd += ["--steps", str(a.steps)]
    if a.questions:
        cmd.append(f"env.kwargs={{questions: [{', '.join(questions)}]}}")
    cmd += a.overrides
    res: dict[str, Any] = {"args": vars(a), "job": " ".join(cmd[2:]), "commit": git_commit(), "questions": questions,
                           "load_avg_1m_at_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    res["job_seconds"] = round(time.perf_counter() - t0, 1)
    res["job_rc"] = r.returncode
    res["job_output_tail"] = (r.stdout + r.stderr)[-4000:]
    run = Path(a.out_run)
    if r.returncode != 0:
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
        raise SystemExit(res["job_output_tail"])
    summary = json.loads((run / "summary.json").read_text())
    res["summary"] = {k: v for k, v in summary.items() if k not in ("cost_profile",)}
    cfg = json.loads((run / "config.json").read_text())
    res["resolved"] = {"model.vision": cfg["model"]["vision"], "sft.lr": cfg["sft"]["lr"],
                       "sft.steps": cfg["sft"]["steps"], "sft.batch_size": cfg["sft"]["batch_size"],
                       "train.steps": cfg["train"]["steps"], "train.lr": cfg["train"]["lr"],
                       "algo.group_size": cfg["algo"]["group_size"],
                       "rollout.tasks_per_step": cfg["rollout"]["tasks_per_step"]}
    cases = heldout_cases(questions, a.eval_tasks)
    res["blind_baselines"] = blind_baselines(questions, cases)
    final = run / "checkpoints" / f"step_{cfg['train']['steps']}"
    for name, path in (("sft_model", run / "sft_model"), ("final", final)):
        model, tok, improc = load_vlm(path)
        tok.image_processor = improc
        res[name] = evaluate(model, tok, cases)
        kinds = [c["kind"] for c in cases]
        res[name + "_by_kind"] = {k: sum(int(x) for x, kk in zip(res[name]["real"]["right"], kinds) if kk == k)
                                  / max(kinds.count(k), 1) for k in sorted(set(kinds))}
    res["change"] = {c: paired_change(res["sft_model"][c]["right"], res["final"][c]["right"]) for c in CONDITIONS}
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["load_avg_1m_at_end"] = os.getloadavg()[0]
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("resolved", "blind_baselines", "change", "job_seconds")}, indent=1))


if __name__ == "__main__":
    main()
