"""The GRPO part of `benchmarks/gpu_check.sh`: a short GRPO run on `toy` of a random Qwen2 with
the learner and the in-process HF engine on one device, in bf16, printing one `[gpu-check]`
line per figure: the update's achieved TFLOP/s and MFU, the rollout tokens/s, and the peak
device memory against the learner's 16 bytes/parameter estimate.

    python benchmarks/gpu_check.py --device cuda --steps 20 --out /tmp/gc   # the GPU check
    python benchmarks/gpu_check.py --device cpu --steps 2 --tiny --out /tmp/gc  # --dry-run

Model (not `--tiny`): Qwen2-0.5B's decoder (hidden 896, 24 layers, 14 heads of 64, MLP 4864)
with the embedded tokenizer's small vocabulary, so ~0.4B parameters, randomly initialised.
MFU = 6 * params * update tokens / update seconds / peak (the forward and backward of every
forwarded token, `perf/update_tokens`; the no-grad old-logprob forward is not counted), with
`--peak-tflops` the device's dense bf16 peak (989 TFLOP/s: H100/H200 SXM, NVIDIA's sheet
without sparsity). Medians over the steps after the first two (warm-up, allocator growth).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from agentrl.config import load_config
from agentrl.infra.devices import LEARNER_BYTES_PER_PARAM, GiB
from agentrl.models.tiny import build_tiny_model

SHAPES = {"tiny": dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128),
          "0.5b": dict(hidden_size=896, num_layers=24, num_heads=14, intermediate_size=4864)}
WORDS = ["apple", "river", "stone", "cloud"]


def say(line: str) -> None:
    print(f"[gpu-check] {line}", flush=True)


def build_model(out: Path, shape: str) -> tuple[str, int]:
    """The random Qwen2 of `shape` in `out` (tokenizer trained on the toy env's texts); returns
    (directory, parameter count)."""
    texts = [f"Say the word {w}." for w in WORDS] * 20 + [f"{w} " * 5 for w in WORDS] * 20
    t0 = time.perf_counter()
    path = build_tiny_model(out, texts, vocab_size=512, seed=0, **SHAPES[shape])
    cfg = json.loads((Path(path) / "config.json").read_text())
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).parameters())
    say(f"model: random Qwen2 hidden {cfg['hidden_size']} x {cfg['num_hidden_layers']} layers, vocab "
        f"{cfg['vocab_size']}: {n / 1e6:.1f}M params (built in {time.perf_counter() - t0:.1f} s)")
    return path, n


def run(args: argparse.Namespace) -> int:
    """Build, train `--steps` GRPO steps, print the figures; 0 when the run finished."""
    from agentrl.train import train

    out = Path(args.out)
    path, n = build_model(out / "model", "tiny" if args.tiny else "0.5b")
    cfg = load_config(None, [
        "env.name=toy", f"model.path={path}", f"out={out / 'run'}", "sft.steps=0", f"train.steps={args.steps}",
        f"train.device={args.device}", f"rollout.device={args.device}", "train.precision=bf16",
        "model.dtype=bfloat16", "rollout.tasks_per_step=16", "algo.group_size=8", "rollout.max_tokens=32",
        "train.micro_batch_size=32", "train.eval_tasks=4", "train.eval_samples=1", "train.save_every=0",
        "train.keep_checkpoints=1", "train.log_rollouts_every=0", "log.tensorboard=false", "quiet=true",
        f"train.torch_threads={args.threads}", f"rollout.torch_threads={args.threads}", "seed=0"])
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()
            if '"perf/update_s"' in line]
    say(f"GRPO {len(rows)} steps on {args.device} (bf16 learner, bf16 HF engine): {wall:.1f} s wall")
    steady = rows[2:] or rows
    upd = statistics.median(r["perf/update_s"] for r in steady)
    tok = statistics.median(r["perf/update_tokens"] for r in steady)
    tflops = 6 * n * tok / upd / 1e12
    say(f"update: median {upd:.3f} s for {tok:.0f} tokens: {tflops:.2f} TFLOP/s, MFU {tflops / args.peak_tflops:.2%} "
        f"of {args.peak_tflops:.0f} TFLOP/s (6 * params * tokens / s / peak)")
    episodes = cfg.rollout.tasks_per_step * cfg.algo.group_size
    gen = statistics.median(r["perf/generate_s"] for r in steady)
    sampled = statistics.median(r["rollout/response_len"] * episodes for r in steady)
    say(f"rollout: median {gen:.2f} s generating {sampled:.0f} sampled tokens ({episodes} episodes x "
        f"rollout/response_len): {sampled / gen:.0f} tokens/s")
    est = n * LEARNER_BYTES_PER_PARAM
    if cuda:
        peak = torch.cuda.max_memory_allocated()
        say(f"peak GPU memory {peak / GiB:.2f} GiB (learner, engine copy in bf16 and activations) vs the "
            f"learner's 16 B/param estimate {est / GiB:.2f} GiB + engine {2 * n / GiB:.2f} GiB")
    else:
        say(f"peak GPU memory: no GPU (learner estimate 16 B/param = {est / GiB:.3f} GiB)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tiny", action="store_true", help="a tiny model (the CPU dry run)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM: 989)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
