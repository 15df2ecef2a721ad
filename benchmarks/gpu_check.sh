#!/usr/bin/env bash
# The GPU checks in one script (under 8 minutes on one CUDA GPU), run from the repository root:
#   1. the @pytest.mark.gpu tests (CUDA learner, bf16 vs fp32, NCCL rank, vLLM engine sync);
#   2. a 20-step GRPO run of a random ~0.5B Qwen2 config in bf16 on 1 GPU with vLLM rollout;
#   3. the update's achieved TFLOP/s and MFU (6 * params * trained tokens / update seconds / peak).
# Needs: pip install -e '.[dev]' with a CUDA torch, and vllm (AGENTRL_VLLM_VENV names a venv
# that has it; default: the current interpreter). PEAK_TFLOPS: the GPU's dense bf16 peak
# (default 989, an H100/H200 SXM).
set -uo pipefail
PY=${AGENTRL_VLLM_VENV:+$AGENTRL_VLLM_VENV/bin/}python
PY=${PY:-python}
OUT=${OUT:-/tmp/agentrl_gpu_check}
PEAK=${PEAK_TFLOPS:-989}
mkdir -p "$OUT"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
echo "== 1. GPU tests"
timeout 240 $PY -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -15
echo "== 2. 20-step GRPO, random ~0.5B Qwen2, bf16, vLLM rollout"
$PY - "$OUT" <<'PY'
import sys
from pathlib import Path
from agentrl.config import load_config
from agentrl.models.tiny import build_tiny_model
from agentrl.run import default_model_dir
out = Path(sys.argv[1]) / "model05b"
if not (out / "config.json").exists():  # the embedded model's tokenizer, a ~0.5B Qwen2 shape
    cfg = load_config(None, ["env.name=code_sandbox", "model.hidden_size=896", "model.num_layers=24",
                             "model.num_heads=14", "model.intermediate_size=4864", "model.vocab_size=4096"])
    built = default_model_dir(cfg, out.parent)  # OUT/base_model
    Path(built).rename(out)
print("model", out)
PY
timeout 360 $PY -m agentrl.cli train --env code_sandbox --algo grpo --steps 20 --out "$OUT/run" --quiet \
  model.path="$OUT/model05b" sft.steps=0 rollout.engine=vllm train.device=cuda train.precision=bf16 \
  train.eval_tasks=16 train.eval_samples=1 train.micro_batch_size=32 2>&1 | tail -6
echo "== 3. update throughput and MFU"
$PY - "$OUT/run/metrics.jsonl" "$OUT/model05b" "$PEAK" <<'PY'
import json, statistics, sys
from transformers import AutoConfig, AutoModelForCausalLM
import torch
rows = [json.loads(l) for l in open(sys.argv[1]) if '"perf/update_s"' in l]
with torch.device("meta"):
    n = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[2])).parameters())
upd = statistics.median(r["perf/update_s"] for r in rows[2:])
tok = statistics.median(r["perf/update_tokens"] for r in rows[2:])
print(f"params {n/1e6:.0f}M, median update {upd:.2f} s, steps {len(rows)}")
if tok:
    tflops = 6 * n * tok / upd / 1e12
    print(f"trained tokens/step {tok:.0f}: {tflops:.1f} TFLOP/s, MFU {tflops / float(sys.argv[3]):.1%}")
PY
