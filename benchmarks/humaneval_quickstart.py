"""What the Quick start's HumanEval line (`agentrl train --env code_sandbox --algo grpo --dataset
../shared/data/HumanEval.jsonl.gz`) costs before RL starts, with its defaults: the embedded
model's build (tokenizer trained on HumanEval's texts) and the seconds per warm-start step, then
the warm start's expected length (`sft.min_steps` .. `sft.steps` steps). Peak resident memory of
this process is reported too. Writes `benchmarks/results/humaneval_quickstart.json`.

    python benchmarks/humaneval_quickstart.py [--dataset PATH] [--sft-steps 5]

Only the start-up and the warm start are timed (the issue: the line "printed nothing for 15 min"
there); RL steps are not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default=str(ROOT.parent / "shared" / "data" / "HumanEval.jsonl.gz"))
    ap.add_argument("--sft-steps", type=int, default=5)
    args = ap.parse_args()
    if not Path(args.dataset).exists():
        args.dataset = "/work/shared/data/HumanEval.jsonl.gz"
    import torch

    from agentrl.config import load_config
    from agentrl.models.tiny import load_model
    from agentrl.rollout.chat import ChatRenderer
    from agentrl.run import build_env, default_model_dir, quiet_libraries
    from agentrl.sft import sft_examples, sft_train

    quiet_libraries()
    cfg = load_config(None, [f"env.dataset={args.dataset}"])
    torch.set_num_threads(cfg.train.torch_threads)
    out = Path(tempfile.mkdtemp(prefix="he_quick_"))
    t0 = time.perf_counter()
    path = default_model_dir(cfg, out)
    build_s = time.perf_counter() - t0
    model, tok = load_model(path)
    renderer = ChatRenderer(tok)
    t0 = time.perf_counter()
    examples = sft_examples(build_env(cfg, "train"), renderer, max(2000, cfg.sft.batch_size),
                            seed=cfg.seed * 7919 + 1)
    examples_s = time.perf_counter() - t0
    lens = sorted(len(e.token_ids) for e in examples)
    pad = tok.pad_token_id if tok.pad_token_id is not None else renderer.end_of_turn_id
    t0 = time.perf_counter()
    sft_train(model, examples, steps=args.sft_steps, lr=cfg.sft.lr, batch_size=cfg.sft.batch_size, pad_id=pad)
    step_s = (time.perf_counter() - t0) / args.sft_steps
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    res = {"commit": commit, "load_1min": os.getloadavg()[0], "model_build_s": build_s,
           "sft_examples_s": examples_s, "sft_examples": len(examples),
           "example_tokens_median": lens[len(lens) // 2], "example_tokens_max": lens[-1],
           "sft_batch_size": cfg.sft.batch_size, "sft_step_s": step_s, "sft_steps_timed": args.sft_steps,
           "sft_min_steps": cfg.sft.min_steps, "sft_steps": cfg.sft.steps,
           "warm_start_min_s": step_s * cfg.sft.min_steps, "warm_start_max_s": step_s * cfg.sft.steps,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    (ROOT / "benchmarks" / "results" / "humaneval_quickstart.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
