"""Can vLLM run the embedded tiny VLM (Qwen2-VL architecture) with images? (issue 26)

Run in the vLLM venv (`.ci/vllm`'s, or any with vllm installed), from the repository root:

    VLLM_ENABLE_V1_MULTIPROCESSING=0 TORCHDYNAMO_DISABLE=1 .venv-vllm/bin/python benchmarks/vllm_vision_probe.py

Four probes, each in its own subprocess (vLLM's import-time state differs between them):
`load_plain` starts `vllm.LLM` on the VLM directory as is (records the error where torchvision
is missing); `widened` (stand-ins of `agentrl.rollout.engines.vllm_vision` on) sends our widened
prompt (9 placeholders per 84x84 image) and records how many ids vLLM makes of it; `collapsed`
sends one placeholder per image and compares vLLM's widened prompt with ours, vLLM's sampled-token
logprobs with the HF model's teacher-forced ones (vision special tokens banned on both sides),
and the same without the ban on the vLLM side (`allowed_token_ids` off). Writes
benchmarks/results/vllm_vision_probe.json (versions, commit, load average, each probe's result).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["How many red squares are in the image?", "Which cell holds the circle?", "Wrong, look again."] * 10


def build(path: str) -> dict:
    """The VLM (text head 64) and two visual_count openings: ids (widened), images, pixels."""
    from agentrl.models.vlm import build_tiny_vlm, load_vlm
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl_envs.visual_count import VisualCountEnv

    d = build_tiny_vlm(path, TEXTS, hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256,
                       vocab_size=400, seed=0)
    _, tok, ip = load_vlm(d)
    r = VisionChatRenderer(tok, ip)
    env = VisualCountEnv(image_format="array")
    cases = []
    for k in (0, 3):
        obs, _ = env.reset(options={"task": k})
        ids, px = r.prompt_inputs(obs)
        cases.append({"ids": ids, "images": [im.tolist() for im in px["images"]]})
    return {"dir": d, "cases": cases, "pad": r.image_token_id, "banned": r.vision_token_ids}


def probe(kind: str, spec_path: str) -> dict:
    """One probe (in a fresh process); returns its result."""
    import numpy as np
    import torch

    spec = json.loads(Path(spec_path).read_text())
    if kind != "load_plain":
        from agentrl.rollout.engines.vllm_vision import patch_transformers_without_torchvision

        patch_transformers_without_torchvision()
    from vllm import LLM, SamplingParams

    from agentrl.rollout.engines.vllm_vision import image_prompt

    try:
        llm = LLM(model=spec["dir"], dtype="float32", seed=0, enforce_eager=True, logprobs_mode="processed_logprobs",
                  kv_cache_memory_bytes=1 << 30, enable_chunked_prefill=False,
                  limit_mm_per_prompt={"image": 2, "video": 0})
    except Exception as e:  # noqa: BLE001 - the probe's finding
        cause = e
        while cause.__cause__ is not None or cause.__context__ is not None:
            cause = cause.__cause__ or cause.__context__
        return {"loaded": False, "error": f"{type(e).__name__}: {str(e)[:300]}",
                "root_cause": f"{type(cause).__name__}: {str(cause)[:300]}"}
    if kind == "load_plain":
        return {"loaded": True}
    from transformers import AutoModelForImageTextToText

    from agentrl.models.vision_logprobs import vision_logprobs
    from agentrl.models.vlm import encode_images, load_vlm

    model = AutoModelForImageTextToText.from_pretrained(spec["dir"], dtype=torch.float32).eval()
    _, _, ip = load_vlm(spec["dir"])
    pad, banned = spec["pad"], spec["banned"]
    vocab = model.config.text_config.vocab_size
    allowed = [i for i in range(vocab) if i not in set(banned)]
    out = []
    for case in spec["cases"]:
        images = [np.asarray(im, dtype=np.uint8) for im in case["images"]]
        px = encode_images(ip, images)
        vision = {"image_grid_thw": px["image_grid_thw"], "images": images}
        if kind == "widened":
            from agentrl.models.vlm import to_pil

            req = {"prompt_token_ids": case["ids"], "multi_modal_data": {"image": [to_pil(im) for im in images]}}
            o = llm.generate([req], SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)[0]
            out.append({"our_ids": len(case["ids"]), "our_placeholders": case["ids"].count(pad),
                        "vllm_ids": len(o.prompt_token_ids), "vllm_placeholders": list(o.prompt_token_ids).count(pad)})
            continue
        req = image_prompt(case["ids"], vision, pad)
        row = {"collapsed_placeholders": req["prompt_token_ids"].count(pad)}
        for ban in (True, False):
            o = llm.generate([req], SamplingParams(max_tokens=8, temperature=1.0, seed=1, logprobs=0, detokenize=False,
                                                   ignore_eos=True, allowed_token_ids=allowed if ban else None),
                             use_tqdm=False)[0]
            toks = list(o.outputs[0].token_ids)
            lps = [o.outputs[0].logprobs[i][t].logprob for i, t in enumerate(toks)]
            full = case["ids"] + toks
            with torch.no_grad():
                ref = vision_logprobs(model, full, px, image_token_id=pad, banned_ids=banned)[len(case["ids"]):]
            key = "banned" if ban else "not_banned_in_vllm"
            row["widened_equal_ours"] = list(o.prompt_token_ids) == case["ids"]
            row[key] = {"tokens": toks, "max_abs_logprob_diff": float(np.abs(np.array(lps) - ref.numpy()).max())}
        out.append(row)
    return {"loaded": True, "cases": out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "vllm_vision_probe.json"))
    ap.add_argument("--probe", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        print("RESULT " + json.dumps(probe(args.probe, args.spec)), flush=True)
        return
    import torch
    import transformers
    import vllm

    from agentrl.rollout.engines.vllm_vision import torchvision_available

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    res: dict = {"commit": commit, "vllm": vllm.__version__, "torch": torch.__version__,
                 "transformers": transformers.__version__, "torchvision_found": torchvision_available(),
                 "load_before": Path("/proc/loadavg").read_text().split()[:3], "probes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps(build(str(Path(tmp) / "vlm"))))
        for kind in ("load_plain", "widened", "collapsed"):
            r = subprocess.run([sys.executable, __file__, "--probe", kind, "--spec", str(spec)],
                               capture_output=True, text=True, timeout=900, env=os.environ.copy())
            lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
            res["probes"][kind] = json.loads(lines[-1][7:]) if lines else {"rc": r.returncode, "stderr": r.stderr[-1500:]}
            # vLLM logs the inspection's own error instead of chaining it: keep those lines
            logged = sorted({x.split("] ", 1)[-1].strip() for x in (r.stdout + r.stderr).splitlines()
                             if "ModuleNotFoundError" in x or "requires the Torchvision" in x})
            if logged:
                res["probes"][kind]["logged_errors"] = logged
            print(kind, json.dumps(res["probes"][kind])[:600], flush=True)
    res["load_after"] = Path("/proc/loadavg").read_text().split()[:3]
    Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
