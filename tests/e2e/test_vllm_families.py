"""Every model family (issue 38) on the vLLM engine: the family's tiny random-weight model (head
size 64, a size every vLLM attention backend has) with its published chat template loads in vLLM,
and the multi-turn tool episode of `tests/rollout/test_families.py` (`ToolTurnsEnv`: a tool
result, a user message, an answer) samples token-exactly through `VLLMEngine`: greedy, the
episode's ids equal the HF engine's; at T=1, the loss mask is 1 on exactly the 3 sampled turns
and vLLM's logprobs of the sampled ids equal the HF model's teacher-forced ones.

Runs where vLLM is installed (the vLLM stage of `.ci/vllm`; skipped elsewhere), the engine in
this process; one engine at a time (each family's is dropped after its test).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl.models.families import FAMILIES, build_family
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams

pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is not None:  # before vLLM reads its settings
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

ROLLOUT_TESTS = str(Path(__file__).resolve().parents[1] / "rollout")
SIZES = dict(hidden_size=128, num_heads=2, intermediate_size=256)  # head size 64


@pytest.fixture(scope="module")
def tool_env():
    """`ToolTurnsEnv` of tests/rollout/test_families.py (skips the module without vLLM;
    AGENTRL_REQUIRE_VLLM=1, the vLLM stage, fails instead)."""
    if os.environ.get("AGENTRL_REQUIRE_VLLM") == "1":
        import vllm  # noqa: F401
    else:
        pytest.importorskip("vllm", reason="vLLM is not installed (docs/scale_out.md)")
    if ROLLOUT_TESTS not in sys.path:
        sys.path.insert(0, ROLLOUT_TESTS)
    return importlib.import_module("test_families").ToolTurnsEnv


def episodes(engine, renderer, env_cls, temperature: float, n: int):
    p = SamplingParams(temperature=temperature, max_tokens=8, stop_token_ids=renderer.stop_ids)
    return run_episodes(engine, renderer, [env_cls() for _ in range(n)],
                        [EpisodeSpec({"seed": k}, group_id=k) for k in range(n)], p, seed=3)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_loads_in_vllm_and_samples_a_tool_episode_token_exactly(name, tool_env, tmp_path):
    from agentrl.learner.forward import token_logprobs
    from agentrl.models.tiny import load_model
    from agentrl.rollout.engines.hf import HFEngine
    from agentrl.rollout.engines.vllm import VLLMEngine

    model_dir = build_family(name, tmp_path / "model", **SIZES)
    t0 = time.perf_counter()
    engine = VLLMEngine(model_dir, dtype="float32", kv_cache_memory_bytes=64 << 20)  # as rollout.dtype
    print(f"{name}: vLLM engine start {time.perf_counter() - t0:.1f} s")
    try:
        hf = HFEngine(model_dir, torch_threads=1)
        r = ChatRenderer(hf.tokenizer)
        got, want = episodes(engine, r, tool_env, 0.0, 1), episodes(hf, r, tool_env, 0.0, 1)
        assert got[0].token_ids == want[0].token_ids and got[0].loss_mask == want[0].loss_mask
        model, _ = load_model(model_dir)
        for tr in episodes(engine, r, tool_env, 1.0, 2):
            assert len(tr.turns) == 3 and tr.terminated and not tr.info.get("error")
            sampled = [k for t in tr.turns for k in range(t.start, t.end)]
            assert [k for k, m in enumerate(tr.loss_mask) if m] == sampled
            ids = torch.tensor([tr.token_ids])
            with torch.no_grad():
                lp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=1.0)
            diff = max(abs(float(lp[0, k]) - tr.sampler_logprobs[k]) for k in sampled)  # lp[0, k]: token k
            assert diff < 1e-4, (name, diff)
    finally:
        engine.close()



def test_close_shuts_an_engine_down_and_the_next_one_in_this_process_works(tool_env, tmp_path):
    """`VLLMEngine.close()` shuts the engine core down now (vLLM's finalizer, run whenever the
    collector reached a dropped engine, tore down the process-global distributed state under the
    next engine: "pipeline model parallel group is not initialized" on every generate of this
    module in CI's vLLM stage, stop 46, after three other modules' engines). Idempotent; a
    closed engine refuses to generate; a new engine afterwards samples."""
    from agentrl.rollout.engines.vllm import VLLMEngine

    model_dir = build_family("qwen2_5", tmp_path / "model", **SIZES)
    p = SamplingParams(temperature=0.0, max_tokens=4)
    first = VLLMEngine(model_dir, dtype="float32", kv_cache_memory_bytes=64 << 20)
    want = first.generate([[1, 2, 3]], p)[0].token_ids
    first.close()
    first.close()  # idempotent
    with pytest.raises(AttributeError):
        first.generate([[1, 2, 3]], p)
    second = VLLMEngine(model_dir, dtype="float32", kv_cache_memory_bytes=64 << 20)
    try:
        assert second.generate([[1, 2, 3]], p)[0].token_ids == want
    finally:
        second.close()
