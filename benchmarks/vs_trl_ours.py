"""One agentrl GRPO run for the benchmark (a worker process of vs_trl.py).

Runs the real `agentrl.train.train` loop (no SFT, evaluation on 1 task before/after, outside
the timed steps) and records, per training step, `perf/step_s` and its split (rollout, env,
update, sync), the generated tokens, and the compute timers of `vs_trl_timers`.

    python benchmarks/vs_trl_ours.py --model DIR --prompts 2 --gens 4 --max-tokens 32 --steps 12

Prints `RESULT {json}` as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
T_START = time.perf_counter()
SETUP: dict[str, float] = {}  # CPU and wall seconds from process start to the first step


def ours_overrides(a: argparse.Namespace, out: str) -> list[str]:
    """agentrl config overrides matching the TRL side (see README: settings table)."""
    return [
        "env.name=vs_trl_env:FracAEnv", f"model.path={a.model}",
        f"rollout.tasks_per_step={a.prompts}", f"algo.group_size={a.gens}",
        f"rollout.max_tokens={a.max_tokens}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        "rollout.torch_threads=1", "train.torch_threads=1", "rollout.env_threads=1",
        "algo.name=grpo", "algo.kl_coef=0", "algo.update_epochs=1", "algo.minibatches=1",
        "algo.clip_low=0.2", "algo.clip_high=0.2", "algo.agg=token-mean", "algo.scale=std",
        f"train.lr={a.lr}", "train.weight_decay=0", "train.grad_clip=1.0",
        f"train.micro_batch_size={a.prompts * a.gens}", "sft.steps=0", f"train.steps={a.steps}",
        "train.eval_tasks=1", "train.eval_samples=1", "train.log_rollouts_every=0",
        "train.save_every=0", "log.tensorboard=false", "quiet=true", f"out={out}", f"seed={a.seed}",
        f"train.compile={str(a.compile).lower()}", f"rollout.compile={str(a.compile).lower()}",
    ]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--gens", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="train.compile=true and rollout.compile=true (torch.compile)")
    p.add_argument("--patch", default="", help="comma-separated proposed patches to apply (vs_trl_patches.py)")
    p.add_argument("--toggle", action="store_true",
                   help="A/B in one process: the patches are off on even steps, on on odd steps")
    p.add_argument("--wait-go", action="store_true",
                   help="when set up (before the first step) print READY and wait for a line on stdin")
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    sys.path.insert(0, str(HERE))
    import vs_trl_timers as bt

    bt.pin_threads(1)
    import vs_trl_patches as proposed

    import agentrl.learner.forward as forward_mod
    import agentrl.learner.local as learner_mod
    import agentrl.log.metrics as metrics_log
    import agentrl.rollout.stages as stages_mod
    import agentrl.train as train_mod
    from agentrl.config import load_config
    from agentrl.models import static_decode
    from agentrl.rollout.engines.hf import HFEngine

    if a.toggle and (not a.patch or "all" in a.patch):
        p.error("--toggle needs --patch with the patches named (not all)")
    if a.patch:
        proposed.apply(a.patch.split(","))
    # The engine's decode steps (static decode) are model compute too, as the prefill forwards.
    # Eager: the step's model part (`decode_logits`); compiled: the whole compiled call, whose
    # graph also holds the sampler (a timer inside would break the graph).
    if a.compile:
        static_decode.StaticDecoder.step_sample = bt.timed(static_decode.StaticDecoder.step_sample, "gen_forward")
    else:
        static_decode.decode_logits = bt.timed(static_decode.decode_logits, "gen_forward")
    bt.install()
    tokens = {"n": 0}
    gen = HFEngine.generate

    def generate(self, prompts, params):
        with bt.timer("generate"), bt.phase("generate"):
            out = gen(self, prompts, params)
        tokens["n"] += sum(len(c.token_ids) for c in out)
        return out

    HFEngine.generate = generate
    learner_mod.token_logprobs = bt.timed(learner_mod.token_logprobs, "fwd_logprobs")  # no-grad passes
    forward_mod.token_logprobs = bt.timed(forward_mod.token_logprobs, "fwd_logprobs")  # the update's
    forward_mod.prefix_shared_logprobs = bt.timed(forward_mod.prefix_shared_logprobs, "fwd_logprobs")

    steps: list[dict] = []
    base = {"snap": bt.snapshot(), "tok": 0, "eval": False}
    evaluate = train_mod.evaluate

    def evaluate_untimed(*args, **kw):  # evaluation is not part of a training step
        base["eval"] = True
        try:
            r = evaluate(*args, **kw)
        finally:
            base["eval"] = False
        if a.wait_go and not base.get("released"):  # set up; the orchestrator says when to run
            base["released"] = True
            SETUP["cpu_s"], SETUP["wall_s"] = time.process_time(), time.perf_counter() - T_START
            print("READY", flush=True)
            sys.stdin.readline()
        base["snap"], base["tok"] = bt.snapshot(), tokens["n"]
        return r

    # the step's own clock: from the start of `collect` to the end of the weight sync
    collect = stages_mod.collect

    def collect_clocked(*args, **kw):
        if not base["eval"]:
            if a.toggle:  # steps 0, 2, 4, ... without the patches; 1, 3, 5, ... with them
                on = len(steps) % 2 == 1
                for name in a.patch.split(","):
                    proposed.ENABLED[name] = on
                base["patched"] = on
            base["t0"], base["c0"] = time.perf_counter(), time.process_time()
        return collect(*args, **kw)

    stages_mod.collect = collect_clocked
    sync = HFEngine.update_weights

    def sync_clocked(self, state_dict, version):
        sync(self, state_dict, version)
        base["t1"], base["c1"] = time.perf_counter(), time.process_time()

    HFEngine.update_weights = sync_clocked

    train_mod.evaluate = evaluate_untimed
    log = metrics_log.MetricsLog.log

    def log_step(self, step, metrics):
        if "perf/step_s" in metrics:
            now = bt.snapshot()
            d = bt.diff(now, base["snap"])
            steps.append({"step": step, "sec": metrics["perf/step_s"],
                          "rollout_s": metrics["perf/rollout_s"], "env_s": metrics["perf/env_s"],
                          "update_s": metrics["perf/update_s"], "sync_s": metrics["perf/sync_s"],
                          "gen_tokens": tokens["n"] - base["tok"],
                          "wall_s": base["t1"] - base["t0"], "cpu_s": base["c1"] - base["c0"],
                          "patched": base.get("patched", bool(a.patch)),
                          "reward": metrics["rollout/reward_mean"], **d})
            base["snap"], base["tok"] = now, tokens["n"]
        return log(self, step, metrics)

    metrics_log.MetricsLog.log = log_step
    with tempfile.TemporaryDirectory(prefix="bench_ours_") as out:
        cfg = load_config(overrides=ours_overrides(a, out))
        t0 = time.perf_counter()
        train_mod.train(cfg)
        train_wall = time.perf_counter() - t0
    res = {"side": "agentrl", "steps": steps, "peak_rss_mb": bt.peak_rss_mb(),
           "process_s": time.perf_counter() - t_start, "setup": SETUP, "train_call_s": train_wall,
           "torch_threads": __import__("torch").get_num_threads(),
           "omp": os.environ.get("OMP_NUM_THREADS"), "patch": a.patch}
    print("RESULT " + json.dumps(res), flush=True)
    return res


if __name__ == "__main__":
    main()
