"""`VisionHFEngine` one row at a time (`max_batch=1`) vs batched, and the learner's forward with
pixels per row vs batched, in the same process.

    python benchmarks/vision_engine_batching.py                  # 16 prompts x 8 samples
    python benchmarks/vision_engine_batching.py --prompts 8 --n 4 --repeats 5

Model: the embedded VLM at the default `model` sizes (`agentrl/config/__init__.py`: hidden 128, 4 layers,
4 heads, vocab 1024, vision tower 2 blocks of width 32; init std 0.1 as `VISION_DEFAULTS`),
built in a temporary directory with a tokenizer trained on `visual_count`'s texts. Prompts: the
opening observations of `visual_count` tasks 0..P-1 (an 84x84 board, 9 image ids, both question
kinds). One call samples `--n` completions per prompt at temperature 1, seeded, up to
`--max-tokens` tokens (the random model seldom stops early, so rows run the full length).

Two figures, each the median over `--repeats` rounds that alternate the two arms (so both see
the same machine load), in wall and process CPU time:

- generate: one `generate` call of P x n rows with `max_batch=1` (each row prefilled with its
  image and decoded alone, the engine before batching) vs `max_batch=128` (one chunk; each
  prompt prefilled once, its n samples decoded together). The completions of the two arms are
  compared (same tokens expected: a row's draws depend only on its seed).
- learner: teacher-forced logprobs (no grad) of the P x n trajectories of that call, one forward
  per row (`vision_logprobs`, the learner's path before batching) vs `token_logprobs(vision=)`
  on right-padded micro-batches of `--micro-batch` rows.

Writes benchmarks/results/vision_engine_batching.json (settings, versions, the commit, load
average, per-round times, medians and ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    w, c = _clock()
    return w - t0[0], c - t0[1]


def build(tmp: str, n_prompts: int, init_std: float):
    """(model, renderer, prompts, images) on the embedded VLM at the default sizes."""
    from agentrl.models.vlm import build_tiny_vlm, load_vlm
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl_envs.visual_count import FEEDBACK, VisualCountEnv, make_task

    texts = [make_task(k).question for k in range(200)] + [FEEDBACK, "1,2", "3", "2,3"] * 20
    d = build_tiny_vlm(Path(tmp) / "vlm", texts, init_std=init_std)
    model, tok, ip = load_vlm(d)
    r = VisionChatRenderer(tok, ip)
    env = VisualCountEnv()
    prompts, images = [], []
    for k in range(n_prompts):
        obs, _ = env.reset(options={"task": k})
        ids, px = r.prompt_inputs(obs)
        prompts.append(ids)
        images.append({"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"]})
    return model, r, prompts, images


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--micro-batch", type=int, default=16, help="learner rows per forward (batched arm)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--init-std", type=float, default=0.1)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "vision_engine_batching.json"))
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    sys.path.insert(0, str(ROOT))
    import torch
    import transformers

    from agentrl.learner.forward import token_logprobs
    from agentrl.models.vision_logprobs import vision_logprobs
    from agentrl.rollout.engines.base import SamplingParams
    from agentrl.rollout.engines.hf_vision import VisionHFEngine

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model, r, prompts, images = build(tmp, args.prompts, args.init_std)
    engines = {mb: VisionHFEngine(model, image_token_id=r.image_token_id, banned_ids=r.vision_token_ids,
                                  max_batch=mb) for mb in (1, 128)}
    p = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, n=args.n, seed=0, stop_token_ids=r.stop_ids)
    engines[128].generate(prompts[:2], SamplingParams(temperature=1.0, max_tokens=2, n=2, seed=0))  # warm-up

    gen: dict[str, list[list[float]]] = {"one_row": [], "batched": []}
    outs = {}
    for _ in range(args.repeats):
        for arm, mb in (("one_row", 1), ("batched", 128)):
            t0 = _clock()
            outs[arm] = engines[mb].generate(prompts, p, images=images)
            gen[arm].append(list(_since(t0)))
    same = sum(a.token_ids == b.token_ids for a, b in zip(outs["one_row"], outs["batched"], strict=True))
    gap = max(abs(x - y) for a, b in zip(outs["one_row"], outs["batched"], strict=True)
              for x, y in zip(a.logprobs, b.logprobs))

    # the learner's forward over the sampled trajectories (prompt + completion)
    rows = [prompts[k // args.n] + c.token_ids for k, c in enumerate(outs["batched"])]
    vis = [images[k // args.n] for k in range(len(rows))]
    width = max(map(len, rows))
    ids = torch.tensor([x + [0] * (width - len(x)) for x in rows])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in rows])
    lrn: dict[str, list[list[float]]] = {"one_row": [], "batched": []}
    lp = {}
    with torch.no_grad():
        for _ in range(args.repeats):
            t0 = _clock()
            lp["one_row"] = [vision_logprobs(model, x, v, image_token_id=r.image_token_id,
                                             banned_ids=r.vision_token_ids) for x, v in zip(rows, vis, strict=True)]
            lrn["one_row"].append(list(_since(t0)))
            t0 = _clock()
            mb = args.micro_batch
            lp["batched"] = torch.cat([token_logprobs(model, ids[i:i + mb], mask[i:i + mb], vision=vis[i:i + mb])[0]
                                       for i in range(0, len(rows), mb)])
            lrn["batched"].append(list(_since(t0)))
    lgap = 0.0
    for i, ref in enumerate(lp["one_row"]):
        fin = torch.isfinite(ref)
        lgap = max(lgap, float((lp["batched"][i, :len(ref)][fin] - ref[fin]).abs().max()))

    def summary(d: dict[str, list[list[float]]]) -> dict[str, float]:
        med = {f"{arm}_{k}_s": statistics.median(t[j] for t in d[arm]) for arm in d for j, k in enumerate(("wall", "cpu"))}
        med["ratio_wall"] = med["one_row_wall_s"] / med["batched_wall_s"]
        med["ratio_cpu"] = med["one_row_cpu_s"] / med["batched_cpu_s"]
        return med

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, cwd=ROOT).stdout.strip())
    res = {
        "commit": commit, "dirty": dirty, "torch": torch.__version__, "transformers": transformers.__version__,
        "threads": args.threads, "load_average": os.getloadavg(),
        "settings": {"prompts": args.prompts, "n": args.n, "rows": len(rows), "max_tokens": args.max_tokens,
                     "repeats": args.repeats, "micro_batch": args.micro_batch, "init_std": args.init_std,
                     "prompt_tokens": sorted({len(x) for x in prompts}),
                     "params": sum(t.numel() for t in model.parameters())},
        "generate": {**summary(gen), "rounds": gen, "same_tokens_rows": same,
                     "max_logprob_gap": gap, "new_tokens": sum(len(c.token_ids) for c in outs["batched"])},
        "learner": {**summary(lrn), "rounds": lrn, "max_logprob_gap": lgap},
    }
    for part in ("generate", "learner"):
        s = res[part]
        print(f"{part}: one row at a time {s['one_row_wall_s']:.3f} s wall ({s['one_row_cpu_s']:.3f} s CPU), "
              f"batched {s['batched_wall_s']:.3f} s wall ({s['batched_cpu_s']:.3f} s CPU): "
              f"{s['ratio_wall']:.1f}x wall, {s['ratio_cpu']:.1f}x CPU; max logprob gap {s['max_logprob_gap']:.2e}")
    print(f"generate: {same}/{len(rows)} rows with the same tokens in both arms")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
