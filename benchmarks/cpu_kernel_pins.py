"""What pinning torch's CPU kernels would cost the main job: the embedded model's training step
(forward and backward of a [16, 256] batch) and its decoding (8 rows x 64 tokens with a KV
cache), timed in a fresh process per setting of the kernel variables, on one torch thread:

- native: the machine's own choice (MKL's branch for this CPU, ATen's best kernel set),
- `MKL_CBWR=AVX2 ATEN_CPU_CAPABILITY=avx2`: MKL's AVX2 branch (reproducible across Intel CPUs
  with AVX2; on other vendors MKL keeps its own choice, Intel's oneMKL guide, "Getting Started
  with Conditional Numerical Reproducibility") and ATen's AVX2 kernels,
- `MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default`: MKL's SSE2 branch without the vendor-
  dependent approximate instructions, and ATen's scalar kernels: the pin under which x86 CPUs
  of either vendor round alike.

For each setting: the median seconds of `--repeats` timed calls of each part, its ratio to
native measured in the same run (settings alternate, so load drifts hit all alike), and a hash
of the step's logits, which tells whether the setting rounds differently from native on this
machine. README.md ("How the figures are kept true") quotes this script's output.

    python benchmarks/cpu_kernel_pins.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SETTINGS = {
    "native": {},
    "avx2": {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "compatible": {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"},
}


def measure(model_dir: str, calls: int) -> dict:
    """In this process: seconds per training step and per 64-token decode of the model in
    `model_dir` (medians over `calls`), the ATen kernel set in use and a hash of the logits."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (16, 256), generator=g)
    steps, decodes, digest = [], [], ""
    for _ in range(calls + 1):  # the first call warms up
        t = time.perf_counter()
        logits = model(ids).logits
        torch.log_softmax(logits, -1).mean().backward()
        model.zero_grad(set_to_none=True)
        steps.append(time.perf_counter() - t)
        digest = hashlib.sha256(logits.detach().numpy().tobytes()).hexdigest()[:12]
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids[:8, :32], max_new_tokens=64, min_new_tokens=64, do_sample=False,
                           pad_token_id=0)
        decodes.append(time.perf_counter() - t)
    return {"step_s": statistics.median(steps[1:]), "decode_s": statistics.median(decodes[1:]),
            "aten": torch.backends.cpu.get_cpu_capability(), "logits": digest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds over the settings")
    ap.add_argument("--calls", type=int, default=3, help="timed calls of each part per process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.calls)))
        return
    from agentrl.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(tmp, ["def f(x):\n    return x + 1\n"] * 50)
        runs: dict[str, list[dict]] = {k: [] for k in SETTINGS}
        for _ in range(args.repeats):
            for name, extra in SETTINGS.items():
                env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
                env.update({"OMP_NUM_THREADS": "1", **extra})
                out = subprocess.run([sys.executable, __file__, "--child", model_dir, "--calls", str(args.calls)],
                                     env=env, capture_output=True, text=True, check=True).stdout
                runs[name].append(json.loads(out.strip().splitlines()[-1]))
    base = {part: [r[part] for r in runs["native"]] for part in ("step_s", "decode_s")}
    print(f"{args.repeats} rounds x {args.calls} calls, one torch thread; ratio: median over rounds of "
          "the setting's time / native's in the same round")
    print("| setting | ATen kernels | train step s | ratio | decode 64 tok s | ratio | logits as native |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, rs in runs.items():
        cells = [name + (" (" + " ".join(f"{k}={v}" for k, v in SETTINGS[name].items()) + ")" if SETTINGS[name] else ""),
                 rs[0]["aten"]]
        for part in ("step_s", "decode_s"):
            cells.append(f"{statistics.median(r[part] for r in rs):.4f}")
            cells.append(f"{statistics.median(r[part] / b for r, b in zip(rs, base[part])):.2f}x")
        cells.append("yes" if rs[0]["logits"] == runs["native"][0]["logits"] else "no")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
