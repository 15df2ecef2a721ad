"""Decode speed of `HFEngine` with static decode on and off, in the same process.

    python benchmarks/decode_step.py                       # batch 8 and 64, the TRL benchmark's model
    python benchmarks/decode_step.py --batch 8,32 --repeats 9 --model DIR
    python benchmarks/decode_step.py --compile   # + rollout.compile's compiled step and sampler

Two figures per batch size B, each as the median over `--repeats` rounds that alternate the
two paths (so both see the same machine load), in process CPU time and wall time:

- step: one decode step (B rows, one new token each) of the model alone: `StaticDecoder.step`
  vs the transformers forward with a `DynamicCache`, averaged over `--new` steps after a
  prefill of B prompts of 24-40 tokens.
- generate: what a decode step costs inside `HFEngine.generate` (sampling and bookkeeping
  included): (time of a call with `--new` tokens - time with 1 token) / (`--new` - 1), seeded
  T = 1, no stop tokens.

With `--compile`, a third table compares a decode step inside `generate` of the static decoder
run eagerly and through `torch.compile` (`HFEngine(compile=True)`, `rollout.compile`; step and
sampling in one graph), alternating the same way, after one untimed call per batch size that
compiles (its seconds are printed).

The model defaults to the TRL side-by-side benchmark's tiny Qwen2 (`vs_trl_model.py`: 417K
parameters, 2 layers, 4 heads / 2 KV heads), built in a temporary directory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _clock() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    c, w = _clock()
    return c - t0[0], w - t0[1]


def make_prompts(batch: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(24, 41, (batch,), generator=g).tolist()
    return [torch.randint(4, vocab, (n,), generator=g).tolist() for n in lengths]


def step_times(engine, prompts: list[list[int]], new: int, static: bool) -> tuple[float, float]:
    """(CPU s, wall s) per decode step of the model alone, after one prefill of `prompts`."""
    from agentrl.models.static_decode import StaticDecoder

    dev = engine.device
    width = max(len(p) for p in prompts)
    B = len(prompts)
    ids = torch.full((B, width), 0, dtype=torch.long)
    mask = torch.zeros((B, width + new), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)
    next_pos = torch.tensor([len(p) for p in prompts], device=dev)
    tokens = torch.arange(B, device=dev) + 10
    with torch.inference_mode():
        cache = engine._new_cache()
        engine._forward(ids, mask[:, :width], pos, cache)
        if static:
            dec = StaticDecoder(engine._decoder(), cache, mask[:, :width], torch.arange(B), width + new)
            t0 = _clock()
            for t in range(new):
                dec.step(tokens, next_pos + t, width + t)
        else:
            t0 = _clock()
            for t in range(new):
                mask[:, width + t] = 1
                engine._forward(tokens[:, None], mask[:, : width + t + 1], (next_pos + t)[:, None], cache)
        c, w = _since(t0)
    return c / new, w / new


def generate_times(engine, prompts: list[list[int]], new: int) -> tuple[float, float]:
    """(CPU s, wall s) per decode step inside `generate` (calls of `new` and 1 tokens)."""
    from agentrl.rollout.engines.base import SamplingParams

    t0 = _clock()
    engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=new, seed=0))
    c_long, w_long = _since(t0)
    t0 = _clock()
    engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=1, seed=0))
    c_one, w_one = _since(t0)
    return (c_long - c_one) / (new - 1), (w_long - w_one) / (new - 1)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model directory (default: vs_trl_model's tiny Qwen2)")
    ap.add_argument("--batch", default="8,64", help="comma list of batch sizes")
    ap.add_argument("--new", type=int, default=64, help="new tokens per row")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="also time HFEngine(compile=True)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from agentrl.models.tiny import load_model
    from agentrl.rollout.engines.hf import HFEngine

    if a.model is None:
        sys.path.insert(0, str(HERE))
        from vs_trl_model import build_tiny_qwen

        tmp = tempfile.mkdtemp(prefix="decode_step_")
        build_tiny_qwen(tmp)
        a.model = tmp
    model, tok = load_model(a.model)
    engines = {"static": HFEngine(model, tok, static_decode=True),
               "transformers": HFEngine(model, tok, static_decode=False)}
    assert engines["static"].static_decode_reason is None, engines["static"].static_decode_reason
    print(f"model {a.model}: {sum(p.numel() for p in model.parameters())} parameters, "
          f"torch {torch.__version__}, {a.threads} thread(s), {a.new} new tokens, {a.repeats} repeats")
    print(f"{'batch':>5} {'what':>8} | {'static ms (cpu/wall)':>21} | {'transformers ms':>17} | "
          f"{'ratio cpu/wall':>14}")
    results = {}
    for B in [int(b) for b in a.batch.split(",")]:
        prompts = make_prompts(B, model.config.vocab_size)
        for what in ("step", "generate"):
            times: dict[str, list[tuple[float, float]]] = {"static": [], "transformers": []}
            for r in range(a.repeats + 1):  # round 0 warms up
                for name in (("static", "transformers") if r % 2 else ("transformers", "static")):
                    eng = engines[name]
                    t = (step_times(eng, prompts, a.new, name == "static") if what == "step"
                         else generate_times(eng, prompts, a.new))
                    if r:
                        times[name].append(t)
            med = {n: (statistics.median(x[0] for x in v) * 1e3, statistics.median(x[1] for x in v) * 1e3)
                   for n, v in times.items()}
            s, f = med["static"], med["transformers"]
            results[f"{what}_b{B}"] = {"static_ms": s, "transformers_ms": f,
                                       "ratio": (f[0] / s[0], f[1] / s[1])}
            print(f"{B:>5} {what:>8} | {s[0]:>9.3f} / {s[1]:>9.3f} | {f[0]:>7.3f} / {f[1]:>7.3f} | "
                  f"{f[0] / s[0]:>5.2f}x / {f[1] / s[1]:>5.2f}x")
    if a.compile:
        results.update(compiled_vs_eager(model, tok, a, engines["static"]))
    return results


def compiled_vs_eager(model, tok, a, eager) -> dict:
    """Per decode step inside `generate`: eager static decoder vs `HFEngine(compile=True)`."""
    from agentrl.rollout.engines.hf import HFEngine

    comp = HFEngine(model, tok, compile=True)
    print(f"{'batch':>5} {'what':>8} | {'eager ms (cpu/wall)':>21} | {'compiled ms':>17} | "
          f"{'compiled/eager':>14}")
    results = {}
    for B in [int(b) for b in a.batch.split(",")]:
        prompts = make_prompts(B, model.config.vocab_size)
        t0 = time.perf_counter()
        generate_times(comp, prompts, a.new)  # compiles (once per process; then reused)
        print(f"{B:>5} compile: first calls took {time.perf_counter() - t0:.1f} s")
        times: dict[str, list[tuple[float, float]]] = {"eager": [], "compiled": []}
        for r in range(a.repeats + 1):
            for name in (("eager", "compiled") if r % 2 else ("compiled", "eager")):
                t = generate_times(comp if name == "compiled" else eager, prompts, a.new)
                if r:
                    times[name].append(t)
        e, c = ((statistics.median(x[0] for x in times[n]) * 1e3, statistics.median(x[1] for x in times[n]) * 1e3)
                for n in ("eager", "compiled"))
        results[f"compiled_generate_b{B}"] = {"eager_ms": e, "compiled_ms": c, "ratio": (c[0] / e[0], c[1] / e[1])}
        print(f"{B:>5} {'generate':>8} | {e[0]:>9.3f} / {e[1]:>9.3f} | {c[0]:>7.3f} / {c[1]:>7.3f} | "
              f"{c[0] / e[0]:>5.2f}x / {c[1] / e[1]:>5.2f}x")
    return results


if __name__ == "__main__":
    main()
