"""vLLM's default multiprocess engine (`VLLM_ENABLE_V1_MULTIPROCESSING=1`: the engine core in a
child process, every `collective_rpc` argument serialised with msgpack) receiving weight pushes
in several buckets (issue 39, fault 5): one message of a whole float32 state dict would pass
msgpack's 4 GiB limit from ~1.07B parameters; the engine sends buckets of whole decoder layers
cast to its dtype instead. Here a 4-layer tiny Qwen2 with `rollout.weight_bucket_mb=1` takes 4
buckets, and the engine then samples what the new weights give (greedy ids and logprobs equal
to an HF engine holding the same weights), and the old ones again after a push back.

Also the CPU build's platform defaults (fault 10): eager mode and float32 weights.

Runs in the vLLM stage of CI (.ci/vllm), in a pytest process of its own: vLLM reads the
multiprocessing switch once per process, and the other vLLM tests run the engine in-process.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from agentrl.rollout.engines.base import SamplingParams

pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is not None:  # before vLLM reads its settings
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"  # the engine core in a child process
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

TEXTS = ["Count to 42 and then say the last digit.", "def add_seven(x):\n    return x + 7"] * 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """Tiny Qwen2 with 4 decoder layers of ~0.66 MB each in float32 (head size 64)."""
    if os.environ.get("AGENTRL_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm", reason="vLLM is not installed (the vLLM stage of CI installs the CPU build)")
    from agentrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm_mp") / "model", TEXTS, hidden_size=128,
                            num_layers=4, num_heads=2, intermediate_size=256, vocab_size=400, seed=0)


@pytest.fixture(scope="module")
def engines(model_dir):
    """(the vLLM engine of `make_engine` with 1 MB buckets, an HF engine on the same directory)."""
    from agentrl.config import load_config
    from agentrl.rollout.engines.hf import HFEngine
    from agentrl.rollout.engines.make import make_engine
    from agentrl.rollout.engines.vllm import _engine_in_child_process

    assert _engine_in_child_process()
    cfg = load_config(None, ["rollout.engine=vllm", "rollout.weight_bucket_mb=1", "rollout.torch_threads=1"])
    engine, _ = make_engine(cfg, model_dir)
    return engine, HFEngine(model_dir, torch_threads=1)


def test_cpu_build_defaults(engines):
    engine, _ = engines
    mc = engine.llm.llm_engine.model_config
    assert mc.enforce_eager is True and engine.dtype == torch.float32 and engine.bucket_bytes == 1 << 20


def test_a_push_in_several_buckets_reaches_the_child_engine(engines):
    engine, hf = engines
    from agentrl.rollout.chat import ChatRenderer

    renderer = ChatRenderer(hf.tokenizer)
    prompts = [renderer.prompt_ids([{"role": "user", "content": f"Count to {n}."}]) for n in (12, 345, 7)]
    p = SamplingParams(temperature=0.0, max_tokens=12)
    before = engine.generate(prompts, p)
    base = {k: v.clone() for k, v in hf.model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in base.items() if k != "lm_head.weight"}
    try:
        engine.update_weights(new, 4)
        assert engine.last_push_buckets == 4 and engine.policy_version == 4  # embeddings + layer 0, 1, 2, 3 + norm
        hf.update_weights(new, 4)
        got, want = engine.generate(prompts, p), hf.generate(prompts, p)
        assert max(abs(x - y) for c, b in zip(got, before) for x, y in zip(c.logprobs, b.logprobs)) > 1e-2
        for c, w in zip(got, want):
            assert c.token_ids == w.token_ids
            assert c.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    finally:
        engine.update_weights(base, 0)
        hf.update_weights(base, 0)
    for c, b in zip(engine.generate(prompts, p), before):
        assert c.token_ids == b.token_ids and c.logprobs == pytest.approx(b.logprobs, abs=1e-5)
