"""One TRL GRPOTrainer run for the benchmark (a worker process of vs_trl.py).

The peer baseline (trl_grpo_tiny.py) with the benchmark's settings: same model directory,
the 64 prompts of `vs_trl_env`, reward `frac_a`, constant learning rate, beta 0, loss_type
'dapo' (TRL 1.16's default, token-mean over the batch), no gradient checkpointing, float32 on
CPU, one optimizer step per generation batch. Records per step the wall time (callback from
`on_step_begin` to `on_step_end`, as the peer script), the generated tokens, and the compute
timers of `bench_timers`.

    python benchmarks/vs_trl_trl.py --model DIR --prompts 2 --gens 4 --max-tokens 32 --steps 12

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
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("WANDB_DISABLED", "true")


def trl_config_kwargs(a: argparse.Namespace, out: str) -> dict:
    """GRPOConfig arguments matching the agentrl side (see README: settings table)."""
    return dict(
        output_dir=out, max_steps=a.steps, learning_rate=a.lr, lr_scheduler_type="constant",
        per_device_train_batch_size=a.prompts * a.gens, gradient_accumulation_steps=1,
        num_generations=a.gens, max_completion_length=a.max_tokens, temperature=1.0, top_p=1.0,
        beta=0.0, num_iterations=1, loss_type="dapo", epsilon=0.2, scale_rewards="group",
        max_grad_norm=1.0, weight_decay=0.0, use_vllm=False, report_to="none", bf16=False,
        fp16=False, use_cpu=True, gradient_checkpointing=False, logging_steps=1, save_strategy="no",
        seed=a.seed, dataloader_num_workers=0, disable_tqdm=True, torch_compile=a.compile,
    )


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--gens", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true",
                   help="GRPOConfig(torch_compile=True): the Trainer compiles the model (inductor)")
    p.add_argument("--wait-go", action="store_true",
                   help="when set up (before the first step) print READY and wait for a line on stdin")
    a = p.parse_args(argv)
    t_start = time.perf_counter()
    sys.path.insert(0, str(HERE))
    import vs_trl_timers as bt

    bt.pin_threads(1)
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer
    from vs_trl_env import N_PROMPTS, frac_a, prompt_text

    hf_logging.set_verbosity_error()
    bt.install()
    GRPOTrainer._generate = bt.timed(GRPOTrainer._generate, "generate", in_phase="generate")
    GRPOTrainer._get_per_token_logps_and_entropies = bt.timed(
        GRPOTrainer._get_per_token_logps_and_entropies, "fwd_logprobs")
    tokens = {"n": 0}

    def reward_frac_a(completions, completion_ids=None, **kw):
        tokens["n"] += sum(len(x) for x in completion_ids)
        return [frac_a("".join(m.get("content", "") for m in c) if isinstance(c, list) else c)
                for c in completions]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.rows: list[dict] = []

        def on_train_begin(self, args, state, control, **kw):
            if a.wait_go:  # set up; the orchestrator says when to run
                SETUP["cpu_s"], SETUP["wall_s"] = time.process_time(), time.perf_counter() - T_START
                print("READY", flush=True)
                sys.stdin.readline()

        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.snap, self.tok = time.perf_counter(), bt.snapshot(), tokens["n"]
            self.c0 = time.process_time()

        def on_step_end(self, args, state, control, **kw):
            dt, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
            self.rows.append({"step": state.global_step, "sec": dt, "wall_s": dt, "cpu_s": cpu,
                              "gen_tokens": tokens["n"] - self.tok,
                              **bt.diff(bt.snapshot(), self.snap)})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and self.rows:
                self.rows[-1]["reward"] = logs["reward"]

    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": prompt_text(i)}]}
                            for i in range(N_PROMPTS)])
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as out:
        cfg = GRPOConfig(**trl_config_kwargs(a, out))
        timer = StepTimer()
        trainer = GRPOTrainer(model=model, reward_funcs=reward_frac_a, args=cfg, train_dataset=ds,
                              processing_class=tok, callbacks=[timer])
        t0 = time.perf_counter()
        trainer.train()
        train_wall = time.perf_counter() - t0
    import transformers
    import trl

    res = {"side": "trl", "steps": timer.rows, "peak_rss_mb": bt.peak_rss_mb(),
           "process_s": time.perf_counter() - t_start, "setup": SETUP, "train_call_s": train_wall,
           "torch_threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
           "derived": {"loss_type": cfg.loss_type, "scale_rewards": cfg.scale_rewards,
                       "epsilon": cfg.epsilon, "epsilon_high": cfg.epsilon_high,
                       "num_iterations": cfg.num_iterations, "beta": cfg.beta, "optim": str(cfg.optim),
                       "generation_batch_size": cfg.generation_batch_size,
                       "steps_per_generation": cfg.steps_per_generation},
           "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                        "torch": torch.__version__}}
    print("RESULT " + json.dumps(res), flush=True)
    return res


if __name__ == "__main__":
    main()
