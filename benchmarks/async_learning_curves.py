"""Learning curves of a synchronous and an asynchronous run of the main job, per sample and per
second: rollout reward (a moving average) against episodes sampled and against wall clock, and
the held-out pass@1 before and after RL of each run.

    agentrl train --env code_sandbox --algo grpo --out /tmp/lc_sync
    agentrl train --env code_sandbox --algo grpo --out /tmp/lc_async rollout.mode=async train.max_staleness=2
    python benchmarks/async_learning_curves.py /tmp/lc_sync /tmp/lc_async --png docs/async_learning_curves.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load(run: Path) -> dict:
    cfg = json.loads((run / "config.json").read_text())
    per_step = cfg["rollout"]["tasks_per_step"] * cfg["algo"]["group_size"]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/reward_mean" in r]
    summ = json.loads((run / "summary.json").read_text())
    label = cfg["rollout"]["mode"]
    if label == "async":
        label += f" (K={cfg['train']['max_staleness']}, {cfg['rollout'].get('batches_in_flight', 1)} in flight)"
    return {"label": label, "samples": [r["step"] * per_step for r in steps],
            "seconds": [r.get("perf/loop_s") for r in steps],
            "reward": [r["rollout/reward_mean"] for r in steps],
            "pass": [r["rollout/pass_rate"] for r in steps],
            "before": summ["eval_before"]["pass@1"], "after": summ["eval_after"]["pass@1"],
            "rl_s": summ.get("rl_s")}


def smooth(xs: list[float], k: int = 9) -> list[float]:
    out = []
    for i in range(len(xs)):
        w = xs[max(0, i - k + 1): i + 1]
        out.append(sum(w) / len(w))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+")
    p.add_argument("--png", default="async_learning_curves.png")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [load(Path(r)) for r in args.runs]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for d in data:
        txt = f"{d['label']}: held-out pass@1 {d['before']:.3f} -> {d['after']:.3f}"
        axes[0].plot(d["samples"], smooth(d["reward"]), label=txt)
        if all(s is not None for s in d["seconds"]):
            axes[1].plot(d["seconds"], smooth(d["reward"]), label=d["label"])
        print(f"{txt}; RL loop {d['rl_s']:.0f} s; rollout reward (mean of steps) at samples "
              + ", ".join(f"{d['samples'][i]}: {sum(d['reward'][max(0, i - 9):i + 1]) / len(d['reward'][max(0, i - 9):i + 1]):.3f}"
                          for i in range(9, len(d["samples"]), 20)))
    axes[0].set_xlabel("episodes sampled")
    axes[1].set_xlabel("seconds of the RL loop")
    for ax in axes:
        ax.set_ylabel("rollout reward (moving avg, 9 steps)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.png, dpi=90)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
