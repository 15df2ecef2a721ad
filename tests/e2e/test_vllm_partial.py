"""Partial rollouts on vLLM (`VLLMEngine.weight_poll`, `agentrl.rollout.engines.vllm_partial`): a
weight push inside a running `generate` aborts its requests, loads the weights and resubmits each
row from its prefix. Checked against the HF engine with the same switches at the same positions
(greedy: token for token), the teacher-forced logprobs of each token under the weights of its
version, and the versions per token; seeded sampling gives the same tokens when repeated.

Runs where vLLM is installed (the CPU build in its own venv: .ci/vllm), engine in this process.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from agentrl.rollout.engines.base import SamplingParams

pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is not None:  # before vLLM reads its settings
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

TEXTS = ["Count to 42 and then say the last digit.", "Now the last digit.",
         "def add_seven(x):\n    return x + 7"] * 40
P1, P2 = 5, 12  # the pushes land after the 5th and the 12th token


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """Tiny Qwen2, tied embeddings, head size 64; skips where vLLM is not installed (fails with
    AGENTRL_REQUIRE_VLLM=1, as in the vLLM stage of CI)."""
    if os.environ.get("AGENTRL_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm", reason="vLLM is not installed (docs/scale_out.md)")
    from agentrl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm_partial") / "model", TEXTS, hidden_size=128,
                            num_layers=2, num_heads=2, intermediate_size=256, vocab_size=400, seed=0)


@pytest.fixture(scope="module")
def weights(model_dir):
    """Three weight sets: A (the model's), B and C (A plus seeded noise of twice each tensor's
    std: the tiny model then greedily repeats other tokens than A's); `lm_head.weight` left out
    so that it stays tied to the embeddings."""
    from agentrl.models.tiny import load_model

    model, _ = load_model(model_dir)
    a = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    out = [a]
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        out.append({k: v + 2.0 * v.std().nan_to_num(0.0) * torch.randn(v.shape, generator=g)
                    if v.is_floating_point() and v.numel() > 1 else v.clone() for k, v in a.items()})
    return out


@pytest.fixture(scope="module")
def engine(model_dir):
    from agentrl.rollout.engines.vllm import VLLMEngine

    e = VLLMEngine(model_dir, dtype="float32", seed=0)
    yield e
    e.close()


@pytest.fixture(scope="module")
def hf(model_dir):
    from agentrl.rollout.engines.hf import HFEngine

    return HFEngine(model_dir, torch_threads=1)


@pytest.fixture(scope="module")
def prompts(hf):
    from agentrl.rollout.chat import ChatRenderer

    r = ChatRenderer(hf.tokenizer)
    return [r.prompt_ids([{"role": "user", "content": t}]) for t in ("Count to 12.", "cats", "Now the last digit.")], \
        r.stop_ids


class Switches:
    """A `weight_poll` that loads version v's weights at its `at[v - 1]`-th call (after that
    many tokens: both engines call it once per decode step)."""

    def __init__(self, engine, weights, at):
        self.engine, self.weights, self.at, self.calls = engine, weights, list(at), 0

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls not in self.at:
            return False
        v = self.at.index(self.calls) + 1
        self.engine.update_weights(self.weights[v], v)
        return True


def run(engine, weights, prompts, params, at):
    """`engine.generate` from weights A with pushes at `at` (the poll removed afterwards)."""
    engine.update_weights(weights[0], 0)
    engine.weight_poll = Switches(engine, weights, at)
    try:
        return engine.generate(prompts, params)
    finally:
        engine.weight_poll = None


def teacher_forced(model_dir, weights, prompt, ids, vers):
    """Per token, its logprob (log_softmax at T = 1) under the weights of its version, from a full
    forward of prompt + ids."""
    from agentrl.models.tiny import load_model

    model, _ = load_model(model_dir)
    out = []
    for i, v in enumerate(vers):
        model.load_state_dict(weights[v], strict=False)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids[:i]])).logits[0, -1].float()
        out.append(float(torch.log_softmax(logits, -1)[ids[i]]))
    return out


IN_PROCESS = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
"""vLLM's engine in this process: one `step` is one decode step of every row, so the pushes land
after exactly P1 and P2 tokens. With the engine core in a child process the core starts on the
first request before the others arrive and runs ahead of the client, so where a push lands in
each row depends on timing: the tests then take each row's switch positions from its versions."""


def switch_positions(versions: list[int]) -> list[int]:
    """Where each version after 0 starts in a row's `versions` (non-decreasing, each of 0, 1, 2
    in turn; a version not reached: the row's length)."""
    assert versions == sorted(versions) and set(versions) <= {0, 1, 2}, versions
    return [next((i for i, v in enumerate(versions) if v >= k), len(versions)) for k in (1, 2)]


def expected_versions(n: int, at: list[int]) -> list[int]:
    p1, p2 = at
    return [0] * min(n, p1) + [1] * max(0, min(n, p2) - p1) + [2] * max(0, n - p2)


def check_row(out, at, model_dir, weights, prompt):
    """A row's versions switch at `at` (P1, P2 in process) and each token's logprob is the
    teacher-forced one under the weights of its version."""
    assert out.versions == expected_versions(len(out.token_ids), at)
    if IN_PROCESS:
        assert at == [min(P1, len(out.token_ids)), min(P2, len(out.token_ids))]
    assert len(out.logprobs) == len(out.token_ids)
    tf = teacher_forced(model_dir, weights, prompt, out.token_ids, out.versions)
    assert out.logprobs == pytest.approx(tf, abs=1e-4)  # each token: its own version's logprob


def test_greedy_interrupted_twice_equals_hf_with_the_same_switches(engine, hf, weights, prompts, model_dir):
    prompt_list, stop = prompts
    params = SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=stop)
    got = run(engine, weights, prompt_list, params, [P1, P2])
    assert engine.policy_version == 2
    plain = run(engine, weights, prompt_list, params, [])
    for r, g in enumerate(got):
        at = switch_positions(g.versions)
        check_row(g, at, model_dir, weights, prompt_list[r])
        (w,) = run(hf, weights, [prompt_list[r]], params, at)  # HF, the same switches in this row
        assert g.token_ids == w.token_ids, r  # nothing sampled twice, nothing lost
        assert g.finish_reason == w.finish_reason and g.versions == w.versions
    assert sum(switch_positions(g.versions)[1] < len(g.token_ids) for g in got) >= 2  # both switches
    assert sum(g.token_ids != p.token_ids for g, p in zip(got, plain)) >= 2  # the switches mattered
    assert all(p.versions == [0] * len(p.token_ids) for p in plain)


def test_seeded_sampling_with_pushes_repeats_and_logprobs_follow_versions(engine, weights, prompts, model_dir):
    """Seeded rows with the pushes at the same positions give the same tokens (a resumed row's
    seed is `resume_seed(row seed, tokens so far)`)."""
    prompt_list, stop = prompts
    params = SamplingParams(temperature=1.0, max_tokens=16, stop_token_ids=stop, n=2, seed=7)
    first = run(engine, weights, prompt_list, params, [P1, P2])
    again = run(engine, weights, prompt_list, params, [P1, P2])
    same = 0
    for r, (o, a) in enumerate(zip(first, again)):
        check_row(o, switch_positions(o.versions), model_dir, weights, prompt_list[r // 2])
        if o.versions == a.versions:  # always in process
            assert o.token_ids == a.token_ids and o.logprobs == pytest.approx(a.logprobs, abs=1e-6), r
            same += 1
    assert same == len(first) or not IN_PROCESS
    assert sum(switch_positions(o.versions)[1] < len(o.token_ids) for o in first) >= 2


def test_a_poll_that_loads_nothing_changes_nothing(engine, weights, prompts):
    """With `weight_poll` set but never loading, the stepped call samples what `LLM.generate`
    samples (same seeds, same tokens and logprobs), every token version 0."""
    prompt_list, stop = prompts
    params = SamplingParams(temperature=1.0, max_tokens=16, stop_token_ids=stop, n=2, seed=11)
    engine.update_weights(weights[0], 0)
    plain = engine.generate(prompt_list, params)
    stepped = run(engine, weights, prompt_list, params, [])
    assert [o.token_ids for o in stepped] == [o.token_ids for o in plain]
    for s, p in zip(stepped, plain):
        assert s.logprobs == pytest.approx(p.logprobs, abs=1e-6)
        assert s.versions == [0] * len(s.token_ids) and s.finish_reason == p.finish_reason


def test_async_training_with_partial_rollouts_on_vllm(engine, tmp_path):
    """`train` with `rollout.engine=vllm` (in this process: a `RolloutPool` of one local worker),
    async, `rollout.partial=true`: the run ends, each trajectory's sampled-token versions never
    go down and stay within `train.max_staleness` of the learner, and staleness is logged per
    token. (Where a push lands depends on timing; on this machine about half the steps have
    trajectories spanning two versions.) The module's engine is closed first: one in-process
    vLLM engine at a time."""
    import json

    from agentrl.config import load_config
    from agentrl.train import train

    engine.close()
    args = ["env.name=toy", "algo.name=grpo", "model.hidden_size=128", "model.num_layers=2",
            "model.num_heads=2", "model.intermediate_size=256", "sft.steps=20", "sft.stop_pass_rate=null",
            "rollout.tasks_per_step=4", "algo.group_size=4", "rollout.max_tokens=96",
            "rollout.max_episode_tokens=1024", "train.eval_tasks=4", "train.eval_samples=2",
            "train.log_rollouts_every=1", "train.steps=4", "train.lr=1e-3", "algo.entropy_coef=0.01",
            "quiet=true", "rollout.engine=vllm", "rollout.torch_threads=1", "train.torch_threads=1",
            "log.tensorboard=false", "rollout.mode=async", "train.max_staleness=2",
            "rollout.batches_in_flight=2", f"out={tmp_path / 'run'}"]
    train(load_config(None, [*args, "rollout.partial=true"]))
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("rollout/staleness_tokens_max" in m for m in metrics)
    n = 0
    for step in range(1, 5):
        for line in (tmp_path / "run" / "rollouts" / f"step_{step}.jsonl").read_text().splitlines():
            vers = [v for v in json.loads(line)["token_versions"] if v >= 0]
            assert vers and vers == sorted(vers) and step - 1 - vers[0] <= 2, (step, vers)
            n += 1
    assert n == 4 * 16
