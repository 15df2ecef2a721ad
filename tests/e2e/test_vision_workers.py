"""A vision-language policy on Ray rollout workers (issue 26): a real local Ray cluster (started
by this module, 1 CPU, one worker) builds the embedded tiny VLM's engine from a model directory,
runs `visual_count` episodes with an image in the opening and in the feedback, and sends the
trajectories, pixels included, back through the object store. They equal the in-process ones
for the same seed, before and after a weight push; the learner's teacher-forced logprobs on
them equal the sampler's (ratio 1, case L4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from agentrl.config import Config
from agentrl.rollout.agent_loop import EpisodeSpec, run_episodes
from agentrl.rollout.engines.base import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["How many red squares are in the image?", "Which cell holds the circle?",
         "What colour is the circle?", "Wrong, look again.", "1,2 red blue green yellow"] * 5


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> str:
    from agentrl.models.vlm import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "m", TEXTS, hidden_size=32, num_layers=1,
                          num_heads=2, intermediate_size=64, vocab_size=320, seed=0)


def vision_cfg(**rollout) -> Config:
    """visual_count, two attempts, the image again with the feedback."""
    return Config.model_validate({
        "env": {"name": "visual_count", "max_turns": 2, "kwargs": {"feedback_image": True}},
        "model": {"vision": True},
        "rollout": {"max_tokens": 6, "max_episode_tokens": 256, "env_threads": 2,
                    "torch_threads": 1, **rollout},
    })


def specs() -> list[EpisodeSpec]:
    """3 training tasks x 2 samples (a group per task)."""
    return [EpisodeSpec({"options": {"task": k}}, group_id=j) for j, k in enumerate((3, 8, 11)) for _ in range(2)]


def in_process(vlm_dir: str, state_dict, seed: int) -> list:
    """What `rollout.num_workers=0` runs: `run_episodes` on one in-process `VisionHFEngine`."""
    from agentrl.config import load_config
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.rollout.engines.make import make_engine
    from agentrl.rollout.envs import build_env

    engine, tok = make_engine(load_config(None, ["rollout.torch_threads=1"]), vlm_dir)
    if state_dict is not None:
        engine.update_weights(state_dict, 1)
    r = VisionChatRenderer(tok, tok.image_processor)
    cfg = vision_cfg()
    envs = [build_env(cfg, "train") for _ in specs()]
    return run_episodes(engine, r, envs, specs(), params(r), max_episode_tokens=256, seed=seed)


def params(renderer) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=6, stop_token_ids=renderer.stop_ids)


def assert_same(got: list, want: list) -> None:
    assert [t.token_ids for t in got] == [t.token_ids for t in want]
    assert [t.loss_mask for t in got] == [t.loss_mask for t in want]
    for a, b in zip(got, want):
        assert a.sampler_logprobs == pytest.approx(b.sampler_logprobs, abs=1e-5)
        assert torch.equal(a.vision["pixel_values"], b.vision["pixel_values"])
        assert torch.equal(a.vision["image_grid_thw"], b.vision["image_grid_thw"])
        assert a.vision["image_spans"] == b.vision["image_spans"]
        assert len(a.vision["images"]) == len(b.vision["images"]) == len(a.vision["image_spans"])
        assert all((x == y).all() and x.dtype == y.dtype for x, y in zip(a.vision["images"], b.vision["images"]))


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    from agentrl.infra.cluster import ensure_ray

    t0 = time.perf_counter()
    ensure_ray(None, num_cpus=1)
    print(f"ray.init: {time.perf_counter() - t0:.1f} s")
    yield ray
    ray.shutdown()


def test_a_ray_worker_runs_image_episodes_as_in_process_and_the_learner_agrees(ray_cluster, vlm_dir):
    """One Ray worker on the VLM directory: the trajectories (ids, masks with the image
    placeholders 0, sampler logprobs, pixels, grids, spans) equal the in-process ones at T=1 on
    the same seed, with the initial weights and after a push of other weights (which the
    worker's VLM then samples from: other tokens); the `Learner`'s logprobs of the pushed policy
    on the worker's trajectories equal the sampler's within 1e-4."""
    from agentrl.algos.shaping import build_batch
    from agentrl.learner.local import Learner
    from agentrl.models.vlm import load_vlm
    from agentrl.rollout.chat import VisionChatRenderer
    from agentrl.rollout.workers import RolloutPool

    pool = RolloutPool(vision_cfg(num_workers=1), vlm_dir)
    try:
        model, tok, ip = load_vlm(vlm_dir)
        r = VisionChatRenderer(tok, ip)
        got0 = pool.run(specs(), params(r), seed=5)
        assert_same(got0, in_process(vlm_dir, None, 5))
        assert {t.info["rollout_worker"] for t in got0} == {0} and {t.policy_version for t in got0} == {0}

        torch.manual_seed(1)  # other weights: every float tensor plus noise
        sd = {k: v + 0.2 * torch.randn_like(v) if v.is_floating_point() else v
              for k, v in model.state_dict().items()}
        pool.update_weights(sd, 4)
        assert pool.policy_versions() == [4]
        got = pool.run(specs(), params(r), seed=5)
        assert_same(got, in_process(vlm_dir, sd, 5))
        assert {t.policy_version for t in got} == {4}
        assert [t.token_ids for t in got] != [t.token_ids for t in got0]  # the push reached the VLM
        for tr in got:
            assert len(tr.vision["image_spans"]) == len(tr.turns) >= 1  # opening (+ feedback) image
            assert tr.vision["image_grid_thw"].tolist() == [[1, 6, 6]] * len(tr.turns)  # 84x84 px
            assert all(tr.token_ids[i] == r.image_token_id and tr.loss_mask[i] == 0
                       for s, e in tr.vision["image_spans"] for i in range(s, e))
            assert sum(e - s for s, e in tr.vision["image_spans"]) == 9 * len(tr.turns)
        assert any(len(tr.turns) == 2 for tr in got)  # a feedback image went through too

        model.load_state_dict(sd)
        batch = build_batch(got, pad_id=tok.pad_token_id)
        mask = batch["loss_mask"].bool()
        lp = Learner(model, lr=1e-3, micro_batch_size=2).logprobs(batch)
        assert int(mask.sum()) >= 12
        assert (lp[mask] - batch["sampler_logprobs"][mask]).abs().max() < 1e-4
    finally:
        pool.shutdown()


@pytest.mark.slow
def test_train_visual_count_on_one_ray_worker_subprocess(tmp_path):
    """`agentrl train --env visual_count model.vision=true rollout.num_workers=1` (2 GRPO
    steps, tiny sizes) as a subprocess: the episodes come from the Ray worker (its weights
    synced after each step), and the learner's logprobs equal the sampler's
    (`loss/logp_mismatch` < 1e-4) at both steps."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
    cmd = [sys.executable, "-m", "agentrl.cli", "train", "--env", "visual_count", "--algo", "grpo",
           "--steps", "2", "--out", str(out), "model.vision=true", "sft.steps=0",
           "rollout.num_workers=1", "rollout.tasks_per_step=2", "algo.group_size=2",
           "train.eval_tasks=2", "train.eval_samples=1", "model.hidden_size=32", "model.num_layers=1",
           "model.num_heads=2", "model.intermediate_size=64", "model.vocab_size=300",
           "rollout.max_tokens=6"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gaps = [row["loss/logp_mismatch"] for row in rows if "loss/logp_mismatch" in row]
    assert len(gaps) == 2 and max(gaps) < 1e-4
    # step 2's episodes: sampled on worker 0 by the weights pushed after step 1, with their image
    recs = [json.loads(line) for line in (out / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert len(recs) == 4
    assert {(r["info"]["rollout_worker"], r["policy_version"]) for r in recs} == {(0, 1)}
    assert all(r["vision"]["image_grid_thw"] == [[1, 6, 6]] for r in recs)
    from agentrl.models.vlm import is_vlm_dir

    assert is_vlm_dir(out / "rollout_model") and is_vlm_dir(out / "checkpoints" / "step_2")


def test_agentrl_eval_of_a_vlm_on_a_ray_worker_equals_in_process(ray_cluster, vlm_dir, tmp_path):
    """`agentrl eval --workers 1` on the VLM directory (the worker renders the images) gives
    the in-process evaluation's episodes (T=1, same seed: the same sampled answers and token
    counts, task by task)."""
    from rich.console import Console

    from agentrl.eval.cli import eval_command

    kw = dict(env="visual_count", model=vlm_dir, samples=2, temperature=1.0, max_tasks=3, seed=0,
              max_tokens=4, console=Console(quiet=True))
    a = eval_command(out=str(tmp_path / "w1"), workers=1, **kw)
    b = eval_command(out=str(tmp_path / "w0"), workers=0, **kw)
    assert a["meta"]["workers"] == 1 and b["meta"]["workers"] == 0
    assert a["overall"]["episodes"] == 6 and a["overall"]["env_errors"] == 0
    rows = [(tmp_path / d / "results.jsonl").read_text().splitlines() for d in ("w1", "w0")]
    answers = [[(json.loads(x)["task_id"], json.loads(x)["messages"][-1]["content"], json.loads(x)["tokens"])
                for x in r] for r in rows]
    assert len(answers[0]) == 6 and answers[0] == answers[1]
    assert len({a for _, a, _ in answers[0]}) > 1  # sampled: not one answer everywhere
