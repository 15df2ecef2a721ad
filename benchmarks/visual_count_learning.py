"""Does GRPO on the embedded tiny vision-language model lift held-out accuracy on
`visual_count` after a short SFT warm start? Runs `agentrl train` once as a subprocess
(in-process rollouts, `VisionHFEngine`) and writes the held-out pass@1 before and after RL,
the SFT losses and the wall time to benchmarks/results/visual_count_learning.json.

    PYTHONPATH=. python benchmarks/visual_count_learning.py [--sft-steps 200] [--steps 20]

Single seed, one run: a figure from it says what this run did, not what the method does on
average. The held-out split is visual_count's own (task seeds whose hash falls in the 20%
held out), evaluated by the training run itself (`train.eval_tasks` tasks x
`train.eval_samples` samples).
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

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sft-steps", type=int, default=200)
    ap.add_argument("--steps", type=int, default=20, help="GRPO steps")
    ap.add_argument("--eval-tasks", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--question", default="count", choices=["count", "where", "both"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "visual_count_learning.json"))
    a = ap.parse_args()
    questions = "[count, where]" if a.question == "both" else f"[{a.question}]"
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "visual_count", "--algo", "grpo",
               "--steps", str(a.steps), "--out", str(run), "model.vision=true", f"seed={a.seed}",
               f"sft.steps={a.sft_steps}", "sft.batch_size=16", "rollout.tasks_per_step=8",
               "algo.group_size=4", f"train.eval_tasks={a.eval_tasks}", "train.eval_samples=1",
               "rollout.max_tokens=6", f"env.kwargs={{questions: {questions}}}"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise SystemExit(r.stdout[-3000:] + r.stderr[-3000:])
        s = json.loads((run / "summary.json").read_text())
    res = {"cmd": " ".join(cmd[1:]).replace(str(run), "OUT"), "wall_s": round(wall, 1),
           "load_avg_1m_at_end": os.getloadavg()[0],
           "heldout_pass@1_before": s["eval_before"]["pass@1"], "heldout_pass@1_before_se": s["eval_before"]["pass@1_se"],
           "heldout_pass@1_after": s["eval_after"]["pass@1"], "heldout_pass@1_after_se": s["eval_after"]["pass@1_se"],
           "sft_loss_first": s.get("sft_loss_first"), "sft_loss_last": s.get("sft_loss_last")}
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
