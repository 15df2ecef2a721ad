"""TRL's GRPOTrainer on the main job for a wall-clock budget (a worker of learning_vs_trl.py).

Loads the warm start (WARM/sft_model), trains on the code_sandbox training tasks in the order
the agentrl run meets them (`learning_vs_trl_common.task_rows`, `shuffle_dataset=False`), with
the env's reward (`CodeReward` on the answer decoded as agentrl decodes it) and GRPOConfig
settings matched to the run config (`trl_config_kwargs`). A callback saves the model and
tokenizer at the first step end after every `--every-s` seconds of training and at the budget
(then stops), and records each checkpoint's training seconds (saves excluded) and samples seen.
Before training (untimed) it checks that TRL's tokenized prompts equal agentrl's rendering.

    python benchmarks/learning_vs_trl_trl.py --warm DIR/warm --out DIR/trl --budget-s 420 --every-s 60

Prints `RESULT {json}` as its last line (also OUT/result.json).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
for _k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_k, "1")
os.environ.setdefault("WANDB_DISABLED", "true")
CHECK_PROMPTS = 1024
"""Rows whose TRL prompt ids are compared with agentrl's before training."""
RECORD_STEPS = 2
"""Training steps whose answers and rewards are kept for the reward-equality check."""


def trl_config_kwargs(cfg, out: str, max_steps: int) -> dict:
    """GRPOConfig arguments matching the agentrl run config `cfg` (README: settings table)."""
    a = cfg.algo
    if a.agg != "token-mean" or a.kl_coef != 0 or a.scale != "std" or a.update_epochs != 1 \
            or a.minibatches != 1 or a.name != "grpo":
        raise ValueError("the TRL mapping covers GRPO with agg=token-mean, kl_coef=0, scale=std, "
                         "update_epochs=1, minibatches=1")
    P, G = cfg.rollout.tasks_per_step, a.group_size
    return dict(
        output_dir=out, max_steps=max_steps, learning_rate=cfg.train.lr, lr_scheduler_type="constant",
        warmup_steps=0, per_device_train_batch_size=P * G, gradient_accumulation_steps=1,
        num_generations=G, max_completion_length=cfg.rollout.max_tokens,
        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=0, beta=0.0,
        num_iterations=1, loss_type="dapo", epsilon=a.clip_low, epsilon_high=a.clip_high,
        scale_rewards="group", mask_truncated_completions=False, max_grad_norm=cfg.train.grad_clip,
        weight_decay=cfg.train.weight_decay, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        use_vllm=False, report_to="none", bf16=False, fp16=False, use_cpu=True,
        gradient_checkpointing=False, logging_steps=1, save_strategy="no", seed=cfg.seed,
        dataloader_num_workers=0, disable_tqdm=True, shuffle_dataset=False,
    )


def main(argv: list[str] | None = None) -> dict:
    sys.path.insert(0, str(HERE))
    from learning_vs_trl_common import worker_args

    a = worker_args(argv)
    t_proc = time.perf_counter()
    sys.path.insert(0, str(HERE))
    import vs_trl_timers as bt

    bt.pin_threads(1)
    import torch
    from datasets import Dataset
    from learning_vs_trl_common import (
        Clock,
        CodeReward,
        result_line,
        run_config,
        save_checkpoint,
        task_rows,
        warm_sandbox,
    )
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from agentrl.rollout.chat import ChatRenderer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    out = Path(a.out)
    (out / "ckpt").mkdir(parents=True, exist_ok=True)
    cfg = run_config(a.warm)
    model_dir = str(Path(a.warm) / "sft_model")
    rows, tasks = task_rows(cfg, a.max_steps)
    reward = CodeReward(cfg)
    sandbox_ok = warm_sandbox(cfg)  # the sandbox pool starts now, not in the first step
    tok = AutoTokenizer.from_pretrained(model_dir)
    renderer = ChatRenderer(tok)
    threads = ThreadPoolExecutor(cfg.rollout.env_threads)  # the env threads agentrl steps envs with
    seen = {"samples": 0, "steps": []}
    recorded: list[dict] = []

    def code_reward(prompts, completions, completion_ids=None, row=None, seed=None, **kw):
        # the action agentrl's env would get: the sampled ids without the stop token, decoded
        texts = [renderer.decode_action(list(ids)) for ids in completion_ids]
        rewards = list(threads.map(lambda it: reward(tasks[it[0]], it[1]), zip(row, texts)))
        seen["samples"] += len(texts)
        seen["steps"].append(sorted(set(int(s) for s in seed)))
        if len(seen["steps"]) <= RECORD_STEPS:
            recorded.extend({"seed": int(s), "text": t, "reward": r} for s, t, r in zip(seed, texts, rewards))
        return rewards

    class Checkpoints(TrainerCallback):
        def __init__(self):
            self.clock = Clock(a.budget_s, a.every_s)
            self.registry: list[dict] = []
            self.rewards: list[dict] = []

        def elapsed(self) -> float:
            return time.perf_counter() - self.t0 - self.clock.saved_s

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
            t = self.elapsed()
            save, stop = self.clock.due(t)
            if save:
                meta = {"step": state.global_step, "wall_s": t, "samples": seen["samples"]}
                dt = save_checkpoint(model, tok, out / "ckpt", len(self.registry) + 1, meta, self.registry)
                self.clock.saved(t, dt)
                self.registry[-1]["save_s"] = dt
                print(f"[trl] checkpoint {len(self.registry)}: step {state.global_step}, {t:.0f} s, "
                      f"{seen['samples']} samples (saved in {dt:.2f} s)", flush=True)
            if stop:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards.append({"step": state.global_step, "wall_s": self.elapsed(),
                                     "reward": logs["reward"]})

    ds = Dataset.from_list(rows)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gcfg = GRPOConfig(**trl_config_kwargs(cfg, str(out / "trainer"), a.max_steps))
    ck = Checkpoints()
    trainer = GRPOTrainer(model=model, reward_funcs=code_reward, args=gcfg, train_dataset=ds,
                          processing_class=tok, callbacks=[ck])
    trainer.remove_callback(PrinterCallback)
    # untimed: TRL's own prompt tokenization vs agentrl's rendering of the same messages
    n = min(CHECK_PROMPTS, len(rows))
    trl_ids = trainer._tokenize_prompts([r["prompt"] for r in rows[:n]])[0]
    diffs = [i for i in range(n) if list(trl_ids[i]) != renderer.prompt_ids(rows[i]["prompt"])]
    prompt_check = {"checked": n, "different": len(diffs), "first_different": diffs[:5],
                    "example_ids": list(trl_ids[0]), "example_messages": rows[0]["prompt"]}
    print(f"[trl] prompt ids: {n - len(diffs)}/{n} equal to agentrl's ChatRenderer.prompt_ids", flush=True)
    print(f"[trl] set up in {time.perf_counter() - t_proc:.0f} s; training for {a.budget_s:.0f} s", flush=True)
    t0 = time.perf_counter()
    trainer.train()
    train_call = time.perf_counter() - t0
    threads.shutdown()
    import transformers
    import trl

    res = {"side": "trl", "checkpoints": ck.registry, "train_rewards": ck.rewards,
           "steps_done": len(seen["steps"]), "max_steps": a.max_steps,
           "ran_out_of_rows": len(seen["steps"]) >= a.max_steps,
           "step_seeds": seen["steps"], "prompt_check": prompt_check, "recorded": recorded,
           "sandbox_warmup_reward": sandbox_ok,
           "train_call_s": train_call, "process_s": time.perf_counter() - t_proc,
           "peak_rss_mb": bt.peak_rss_mb(), "torch_threads": torch.get_num_threads(),
           "derived": {k: str(getattr(gcfg, k)) for k in (
               "learning_rate", "lr_scheduler_type", "per_device_train_batch_size", "num_generations",
               "generation_batch_size", "steps_per_generation", "gradient_accumulation_steps",
               "max_completion_length", "temperature", "top_p", "top_k", "beta", "num_iterations",
               "loss_type", "epsilon", "epsilon_high", "scale_rewards", "mask_truncated_completions",
               "max_grad_norm", "weight_decay", "optim", "adam_beta1", "adam_beta2", "adam_epsilon",
               "shuffle_dataset", "seed")} | {"eos_token_ids": str(trainer.eos_token_ids)},
           "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                        "torch": torch.__version__}}
    (out / "result.json").write_text(json.dumps(res, indent=1))
    result_line({k: v for k, v in res.items() if k not in ("recorded", "step_seeds")})
    return res


if __name__ == "__main__":
    main()
