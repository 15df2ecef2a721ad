"""agentrl's GRPO on the main job for a wall-clock budget (a worker of learning_vs_trl.py).

Runs the real `agentrl.train.train` loop with the warm-start run's config (the main job's
defaults) from WARM/sft_model (`sft.steps=0`), nothing of the library changed: a wrapper of
`MetricsLog.log` reads each step's `perf/loop_s` (wall clock since the loop started), saves the
policy and tokenizer at the first step end after every `--every-s` seconds of training and at
the budget (save time excluded from the clock, as on the TRL side), then stops the loop by
raising. The run's own held-out evaluation before training is cut to 1 task x 1 sample
(`learning_vs_trl.py` evaluates every checkpoint with `agentrl eval` afterwards); it runs before
the loop, outside the clock. Also records the task seeds of every step (`collect`'s seeds).

    python benchmarks/learning_vs_trl_ours.py --warm DIR/warm --out DIR/ours --budget-s 420 --every-s 60

Prints `RESULT {json}` as its last line (also OUT/result.json).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


class BudgetReached(Exception):
    """Raised from the metrics hook at the step end that reaches the budget."""


def ours_overrides(warm: Path, out: Path, max_steps: int) -> list[str]:
    """The warm-start run's config with these on top: the warm model, no SFT, enough steps,
    no per-run evaluation figures, rollouts or checkpoints of its own, no TensorBoard."""
    return [f"model.path={warm / 'sft_model'}", "sft.steps=0", f"train.steps={max_steps}",
            "train.eval_tasks=1", "train.eval_samples=1", "train.eval_every=0", "train.save_every=0",
            "train.log_rollouts_every=0", "log.tensorboard=false", "log.wandb=false", "quiet=true",
            f"out={out / 'run'}", "resume=null", "overwrite=true"]


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(HERE))
    from learning_vs_trl_common import worker_args

    a = worker_args(argv)
    t_proc = time.perf_counter()
    sys.path.insert(0, str(HERE))
    import torch
    import vs_trl_timers as bt
    from learning_vs_trl_common import Clock, result_line, run_config, save_checkpoint, warm_sandbox
    from transformers import AutoTokenizer

    import agentrl.learner.local as learner_mod
    import agentrl.rollout.stages as stages_mod
    import agentrl.train as train_mod
    from agentrl.log.metrics import MetricsLog

    warm, out = Path(a.warm), Path(a.out)
    (out / "ckpt").mkdir(parents=True, exist_ok=True)
    cfg = run_config(warm, ours_overrides(warm, out, a.max_steps))
    tok = AutoTokenizer.from_pretrained(warm / "sft_model")
    sandbox_ok = warm_sandbox(cfg)  # the sandbox pool starts now, not in the first step
    n_eps = cfg.rollout.tasks_per_step * cfg.algo.group_size
    held: dict = {}
    init = learner_mod.Learner.__init__

    def init_kept(self, *args, **kw):  # the policy being trained
        init(self, *args, **kw)
        held["learner"] = self

    learner_mod.Learner.__init__ = init_kept
    step_seeds: list[list[int]] = []
    collect = stages_mod.collect

    def collect_seen(engine, renderer, envs, seeds, group_size, *args, **kw):
        if kw.get("split", "train") == "train" and group_size == cfg.algo.group_size:
            step_seeds.append(sorted(int(s) for s in seeds))
        return collect(engine, renderer, envs, seeds, group_size, *args, **kw)

    stages_mod.collect = collect_seen
    clock = Clock(a.budget_s, a.every_s)
    registry: list[dict] = []
    rewards: list[dict] = []
    log = MetricsLog.log

    def log_step(self, step, metrics):
        log(self, step, metrics)
        if "perf/loop_s" not in metrics:
            return
        t = metrics["perf/loop_s"] - clock.saved_s
        rewards.append({"step": step, "wall_s": t, "reward": metrics["rollout/reward_mean"],
                        "generate_s": metrics.get("perf/generate_s", 0.0), "env_s": metrics.get("perf/env_s", 0.0),
                        "update_s": metrics.get("perf/update_s", 0.0), "cached": metrics.get("sandbox/cached", 0.0),
                        "episodes": n_eps})
        save, stop = clock.due(t)
        if save:
            meta = {"step": step, "wall_s": t, "samples": step * n_eps}
            dt = save_checkpoint(held["learner"].model, tok, out / "ckpt", len(registry) + 1, meta, registry)
            clock.saved(t, dt)
            registry[-1]["save_s"] = dt
            print(f"[ours] checkpoint {len(registry)}: step {step}, {t:.0f} s, {step * n_eps} samples "
                  f"(saved in {dt:.2f} s)", flush=True)
        if stop:
            raise BudgetReached

    MetricsLog.log = log_step
    print(f"[ours] set up (config) in {time.perf_counter() - t_proc:.0f} s; the loop trains for "
          f"{a.budget_s:.0f} s", flush=True)
    t0 = time.perf_counter()
    try:
        train_mod.train(cfg)
        stopped = "max_steps"
    except BudgetReached:
        stopped = "budget"
    train_call = time.perf_counter() - t0
    res = {"side": "agentrl", "checkpoints": registry, "train_rewards": rewards,
           "steps_done": len(rewards), "max_steps": a.max_steps, "stopped_by": stopped,
           "ran_out_of_rows": stopped == "max_steps", "step_seeds": step_seeds,
           "sandbox_warmup_reward": sandbox_ok,
           "train_call_s": train_call, "process_s": time.perf_counter() - t_proc,
           "peak_rss_mb": bt.peak_rss_mb(), "torch_threads": torch.get_num_threads(),
           "config": cfg.model_dump(mode="json")}
    (out / "result.json").write_text(json.dumps(res, indent=1))
    result_line({k: v for k, v in res.items() if k not in ("step_seeds", "config")})
    return res


if __name__ == "__main__":
    main()
