#!/usr/bin/env bash
# The GPU check (issue 39), sized for the machine this project is sometimes lent: one H200,
# Python 3.12 with its own torch (CUDA build) and transformers, no network, no Ray, no vLLM.
# Runs from the working tree as it is, in under 8 minutes, and prints one `[gpu-check]` line per
# check with its figure:
#   1. the project imported from the working tree with the machine's torch;
#   2. the gpu tests (tests/e2e/test_gpu_check.py, and the other `gpu`-marked tests that need
#      no Ray or vLLM): device update == CPU update in fp32, bf16 vs fp32, gradient
#      checkpointing, one NCCL rank (world size 1, no Ray) == in-process, every tensor on the device;
#   3. a 20-step GRPO run of a random ~0.4B Qwen2 (Qwen2-0.5B's decoder) in bf16, learner and
#      in-process HF engine on the GPU (rollout.device=cuda): update TFLOP/s and MFU
#      (6 * params * tokens / update s / peak, PEAK_TFLOPS default 989: H100/H200 SXM dense
#      bf16), rollout tokens/s, peak GPU memory vs the learner's 16 bytes/param estimate.
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine
#   bash benchmarks/gpu_check.sh --dry-run  # the same steps on the CPU, tiny model (CI, ~1 min)
#
# Missing small dependencies travel as wheels in benchmarks/wheels (or $WHEELS): the script
# installs, with --no-deps --no-index, each wheel whose distribution the machine lacks (never
# one it has, never anything that pulls torch). Fetch them on a machine with network, for the GPU
# machine's Python 3.12 (about 15 MB; the versions this project's CI runs):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d benchmarks/wheels \
#     gymnasium==1.4.0 farama-notifications==0.0.6 cloudpickle==2.1.0 pydantic==2.13.4 \
#     pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typer==0.29.2 \
#     click==8.5.1 shellingham==1.5.4 rich==15.0.0 pygments==2.20.0 markdown-it-py==4.3.0 \
#     mdurl==0.1.2 httpx==0.29.0 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 \
#     certifi==2026.5.20 idna==3.20 pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 \
#     pytest-timeout==2.4.0
# (then carry benchmarks/wheels with the working tree: `run` with carry=["benchmarks/wheels"];
# the folder is git-ignored). tests/algos/test_losses.py's gpu test is left out (it needs
# hypothesis).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
DEV=cuda; STEPS=20; TINY=""
[ $DRY = 1 ] && { DEV=cpu; STEPS=2; TINY=--tiny; }
PY=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d /tmp/agentrl_gpu_check.XXXX)}
PEAK=${PEAK_TFLOPS:-989}
WHEELS=${WHEELS:-$ROOT/benchmarks/wheels}
fail=0
t0=$SECONDS

# the project from the working tree: agentrl, and envs/ tools/ under their package names
mkdir -p "$OUT/pp"
ln -sfn "$ROOT/envs" "$OUT/pp/agentrl_envs"
ln -sfn "$ROOT/tools" "$OUT/pp/agentrl_tools"
export PYTHONPATH="$ROOT:$OUT/pp${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ $DRY = 0 ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  need=$($PY - "$WHEELS" <<'PY'
import importlib.metadata as md, pathlib, sys
for w in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):  # name-version-...whl
    try:
        md.version(w.name.split("-")[0].replace("_", "-"))
    except md.PackageNotFoundError:
        print(w)
PY
)
  if [ -n "$need" ]; then
    $PY -m pip install -q --no-deps --no-index $need \
      && echo "[gpu-check] installed $(wc -w <<<"$need") wheels from $WHEELS (--no-deps --no-index)"
  fi
fi

echo "== 1. import"
$PY - "$ROOT" "$DEV" <<'PY' || { echo "[gpu-check] FAIL: the project does not import"; exit 1; }
import importlib.util, os, sys
root, dev = sys.argv[1:]
missing = [m for m in ("gymnasium", "pydantic", "yaml", "typer", "rich", "httpx", "numpy", "transformers",
                       "safetensors", "tokenizers", "pytest") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"[gpu-check] FAIL: missing modules {missing} (bring them as wheels: see this script's header)")
import torch, transformers, agentrl, agentrl_envs
here = os.path.dirname(os.path.dirname(os.path.realpath(agentrl.__file__)))
assert here == os.path.realpath(root), (here, root)
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
print(f"[gpu-check] agentrl from {here}; torch {torch.__version__}, transformers {transformers.__version__}, "
      f"cuda {torch.cuda.is_available()} ({name})")
if dev == "cuda" and not torch.cuda.is_available():
    sys.exit("[gpu-check] FAIL: no CUDA device (use --dry-run on a CPU machine)")
PY

echo "== 2. gpu tests on $DEV"
TESTS="tests/e2e/test_gpu_check.py"
[ $DRY = 0 ] && TESTS="$TESTS tests/learner/test_learner.py tests/learner/test_learner_devices.py"
AGENTRL_GPU_TEST_DEVICE=$DEV timeout 240 $PY -m pytest -q -s -m gpu -p no:cacheprovider $TESTS \
  > "$OUT/gpu_tests.log" 2>&1
rc=$?
grep -h "^\[gpu-check\]" "$OUT/gpu_tests.log"
summary=$(tail -1 "$OUT/gpu_tests.log")
echo "[gpu-check] gpu tests: $summary (log $OUT/gpu_tests.log)"
if [ $rc -ne 0 ]; then fail=1; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -10; fi
if [ $DRY = 1 ] && ! grep -q "5 passed" <<<"$summary"; then
  echo "[gpu-check] FAIL: the dry run must run the 5 gpu-check tests on the CPU"; fail=1
fi

echo "== 3. GRPO, $STEPS steps, bf16, learner and HF engine on $DEV"
timeout 300 $PY benchmarks/gpu_check.py --device "$DEV" --steps "$STEPS" $TINY --out "$OUT/grpo" \
  --peak-tflops "$PEAK" > "$OUT/grpo.log" 2>&1
rc=$?
grep -h "^\[gpu-check\]" "$OUT/grpo.log"
if [ $rc -ne 0 ]; then fail=1; echo "[gpu-check] FAIL: the GRPO run exited $rc:"; tail -15 "$OUT/grpo.log"; fi

echo "[gpu-check] $([ $fail = 0 ] && echo ok || echo FAILED) in $((SECONDS - t0)) s (outputs in $OUT)"
exit $fail
