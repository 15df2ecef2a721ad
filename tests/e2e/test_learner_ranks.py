"""Learner ranks (train.learner_workers >= 1): 2 gloo ranks as Ray actors, FSDP2-sharded, give
the in-process learner's update; global token-mean across ranks with unequal token counts
(hand-computed); a NaN on one rank skips the step on both; dropout is off on the ranks;
sharded checkpoints resume with 1 rank and in-process (resharding); the consolidated export
loads with `from_pretrained`. Real processes, real `torch.distributed`, no mocks."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentrl.algos import get_algorithm
from agentrl.config import algo_config
from agentrl.learner.dist import DataParallel
from agentrl.learner.group import LearnerGroup
from agentrl.learner.local import Learner

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def ray_up():
    from agentrl.infra.cluster import ensure_ray

    ensure_ray(None, num_cpus=2)
    yield


def _model(path: str, **config) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, **config).float()


def _batch(B: int = 6, T: int = 14, seed: int = 1) -> dict:
    """Rows of unequal length and agent-token counts; prompt = the first 4 tokens."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([14, 9, 12, 6, 11, 8][:B])
    ids = torch.randint(3, 200, (B, T), generator=g)  # the tiny vocabulary is smaller
    pos = torch.arange(T)[None]
    attn = (pos < lengths[:, None]).long()
    loss_mask = ((pos >= 4) & (pos < lengths[:, None])).float()
    scores = torch.tensor([1.0, 0, 1, 0, 1, 1][:B])
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = scores  # the episode's reward on its last token (PPO)
    return {"input_ids": ids * attn, "attention_mask": attn, "loss_mask": loss_mask,
            "lengths": lengths, "sampler_logprobs": torch.zeros(B, T),
            "token_rewards": rewards, "scores": scores,
            "group_ids": torch.tensor([0, 0, 1, 1, 2, 2][:B]), "truncated": torch.zeros(B, dtype=torch.bool)}


def _kw(**over) -> dict:
    # lr 1e-4 (the ratios stay near 1 over several steps). At 1e-3 on this 60k-parameter model
    # 4 PPO steps move ratios to 0.74-1.25 and Adam's normalisation grows rounding differences
    # (any other summation order, a world-1 FSDP rank too) to 3e-5 of the weights' scale.
    kw = dict(lr=1e-4, grad_clip=1.0, micro_batch_size=2, prefix_share=False, use_ref=False)
    kw.update(over)
    return kw


def _params(sd: dict) -> dict:
    return {k: v.detach().clone().float() for k, v in sd.items()}


ZERO_GRAD = ("k_proj.bias",)
"""Tensors whose gradient is mathematically 0: a key bias adds the same amount to all of a
query's attention logits, which the softmax ignores. Their float gradient is rounding noise
(about 1e-10), different for any other summation order (another micro-batch size in-process
too), and Adam's first steps scale it to +-lr: they are left out of weight comparisons."""


def _rel(a: dict, b: dict) -> float:
    """max over tensors (but `ZERO_GRAD`) of |a - b|_max / |a|_max (1 for an all-zero a)."""
    assert a.keys() == b.keys()
    worst = 0.0
    for k in [k for k in a if not k.endswith(ZERO_GRAD)]:
        scale = float(a[k].abs().max()) or 1.0
        worst = max(worst, float((a[k] - b[k]).abs().max()) / scale)
    return worst


def _train(learner, algo, cfg, steps: int = 3) -> list[dict]:
    out = []
    for s in range(steps):
        batch = _batch(seed=1 + s)
        batch, _ = algo.prepare(batch, learner, cfg)
        batch["advantages"], _ = algo.advantages(batch, cfg)
        out.append(learner.update(batch, algo, cfg, epochs=cfg.update_epochs,
                                  minibatches=cfg.minibatches, seed=s))
    return out


def test_rows_are_dealt_round_robin_and_every_rank_runs_rank_0s_micro_count():
    units = torch.arange(5)
    assert DataParallel(0, 2).my_units(units).tolist() == [0, 2, 4]
    assert DataParallel(1, 2).my_units(units).tolist() == [1, 3]
    assert DataParallel(1, 2).micro_count(5, 2) == 2  # rank 0: 3 units -> 2 micro-batches
    assert DataParallel(0, 4).micro_count(1, 8) == 1  # ranks without rows still run one


@pytest.mark.parametrize("algo_name,extra", [
    ("grpo", {"update_epochs": 2, "minibatches": 2}),  # 4 optimizer steps per update
    # the value head is sharded too; no value clip: a clip boundary is a discontinuity that a
    # 1e-7 difference in a value can cross (measured: one token of 60 at step 2), which then
    # moves the update by more than rounding
    ("ppo", {"value_clip": None}),
])
def test_two_gloo_ranks_give_the_in_process_update(ray_up, tiny_model_dir, algo_name, extra):
    algo = get_algorithm(algo_name)
    cfg = algo_config(name=algo_name, **extra)
    # attention dropout 0.1 in the config: off in every learner forward, so ratios start at 1
    model = _model(tiny_model_dir, attention_dropout=0.1)
    value = algo.value_head
    local = Learner(copy.deepcopy(model), **_kw(value_head=value))
    group = LearnerGroup(copy.deepcopy(model), _kw(value_head=value), workers=2)
    try:
        assert sum(group.shard_params) == sum(p.numel() for p in local._params())
        assert all(n < sum(group.shard_params) for n in group.shard_params)  # sharded, not copied
        b = _batch()
        assert torch.equal(group.logprobs(b), group.logprobs(b))  # no dropout noise
        gap = (group.logprobs(b) - local.logprobs(b)) * b["attention_mask"]  # pads: chunk-dependent
        assert float(gap.abs().max()) < 1e-5
        m_local, m_group = _train(local, algo, cfg), _train(group, algo, cfg)
        assert abs(m_group[0]["ratio_mean"] - m_local[0]["ratio_mean"]) < 1e-6
        if cfg.update_epochs * cfg.minibatches == 1:  # one step on the sampling weights
            assert abs(m_group[0]["ratio_mean"] - 1.0) < 1e-6  # no dropout noise: exactly 1
        for a, b_ in zip(m_local, m_group):
            assert abs(a["loss"] - b_["loss"]) <= 1e-5 * max(1.0, abs(a["loss"]))
            assert abs(a["grad_norm"] - b_["grad_norm"]) <= 1e-4 * a["grad_norm"]
        p_local = _params(local.state_dict_for_engines())
        p_group = _params(group.state_dict_for_engines())
        moved = _rel(p_local, _params(model.state_dict()))
        assert moved > 1e-3  # the updates moved the weights
        assert _rel(p_local, p_group) < 1e-5
        assert group.optimizer_steps == local.optimizer_steps
        assert group.lr == local.lr
    finally:
        group.shutdown()


def test_token_mean_over_ranks_with_unequal_token_counts(ray_up, tiny_model_dir):
    """GRPO at ratio 1 without clipping: loss = -sum_t A_t / N over the minibatch's N agent
    tokens. Row 0 (rank 0) has 10 agent tokens with A = +1, row 1 (rank 1) 2 with A = -1:
    the global token mean is -(10 - 2) / 12 = -2/3; a mean of the ranks' means would be 0."""
    algo = get_algorithm("grpo")
    cfg = algo_config(name="grpo")
    b = _batch(B=2)
    b["lengths"] = torch.tensor([14, 6])
    pos = torch.arange(14)[None]
    b["attention_mask"] = (pos < b["lengths"][:, None]).long()
    b["loss_mask"] = ((pos >= 4) & (pos < b["lengths"][:, None])).float()
    assert b["loss_mask"].sum(1).tolist() == [10.0, 2.0]
    b["advantages"] = torch.tensor([1.0, -1.0])
    group = LearnerGroup(_model(tiny_model_dir), _kw(), workers=2)
    local = Learner(_model(tiny_model_dir), **_kw())
    try:
        mg = group.update(dict(b), algo, cfg)
        ml = local.update(dict(b), algo, cfg)
        assert mg["loss"] == pytest.approx(-2 / 3, abs=1e-6)
        assert mg["pg_loss"] == pytest.approx(-2 / 3, abs=1e-6)
        assert ml["loss"] == pytest.approx(-2 / 3, abs=1e-6)
        assert _rel(_params(local.state_dict_for_engines()), _params(group.state_dict_for_engines())) < 1e-5
    finally:
        group.shutdown()


def test_a_nan_on_one_rank_skips_the_step_on_both(ray_up, tiny_model_dir):
    algo = get_algorithm("grpo")
    cfg = algo_config(name="grpo")
    model = _model(tiny_model_dir)
    group = LearnerGroup(copy.deepcopy(model), _kw(max_nonfinite_steps=3), workers=2)
    try:
        b = _batch()
        b["advantages"] = torch.tensor([1.0, math.nan, -1.0, 1.0, -1.0, 1.0])  # row 1: rank 1 only
        m = group.update(b, algo, cfg)
        assert m["skipped_nonfinite"] == 1.0 and math.isnan(m["grad_norm"])
        assert group.nonfinite_streak == 1 and group.optimizer_steps == 0
        after = _params(group.state_dict_for_engines())
        assert _rel(_params(model.state_dict()), after) == 0.0  # every rank's shard unchanged
    finally:
        group.shutdown()


def test_sharded_checkpoint_resumes_with_one_rank_and_in_process(ray_up, tiny_model_dir, tiny_tokenizer,
                                                                 tmp_path):
    """2 ranks: 2 updates, save, 1 more update (the reference). The checkpoint loaded by 1
    rank and by the in-process learner, then the same third update: the same weights."""
    from agentrl.learner.lora import merged_state_dict

    algo = get_algorithm("grpo")
    cfg = algo_config(name="grpo", kl_coef=0.05)
    kw = _kw(use_ref=True)
    b3 = _batch(seed=9)
    b3["advantages"], _ = algo.advantages(b3, cfg)

    def third(learner):
        b = dict(b3)
        b["ref_logprobs"] = learner.logprobs(b, ref=True)
        return learner.update(b, algo, cfg, seed=3)

    two = LearnerGroup(_model(tiny_model_dir), kw, workers=2)
    try:
        _train(two, algo, cfg, steps=2)
        ck = two.save(tmp_path / "step_2", tiny_tokenizer, {"step": 2, "policy_version": 2})
        m_ref = third(two)
        want = _params(two.state_dict_for_engines())
    finally:
        two.shutdown()
    assert (ck / "dcp").is_dir() and (ck / "model.safetensors").exists()
    export = AutoModelForCausalLM.from_pretrained(ck)  # the consolidated export loads as is

    one = LearnerGroup(copy.deepcopy(export), kw, workers=1)
    try:
        assert one.load(ck) == {"step": 2, "policy_version": 2}
        assert one.optimizer_steps == 2
        m_one = third(one)
        assert _rel(want, _params(one.state_dict_for_engines())) < 1e-5
        assert m_one["kl"] == pytest.approx(m_ref["kl"], rel=1e-4, abs=1e-7)
    finally:
        one.shutdown()

    local = Learner(copy.deepcopy(export), **kw)
    local.load(ck)
    assert local.optimizer_steps == 2
    third(local)
    assert _rel(want, _params(merged_state_dict(local.model))) < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_nccl_rank_on_a_gpu_gives_the_cpu_update(ray_up, tiny_model_dir):
    """NCCL world size 1 (`train.learner_workers=1 train.learner_gpus=1 train.device=cuda`):
    the update equals the in-process CPU learner's to float32 rounding, and bf16 stays close."""
    algo = get_algorithm("grpo")
    cfg = algo_config(name="grpo")
    model = _model(tiny_model_dir)
    local = Learner(copy.deepcopy(model), **_kw())
    gpu = LearnerGroup(copy.deepcopy(model), _kw(device="cuda"), workers=1, gpus=1)
    bf16 = LearnerGroup(copy.deepcopy(model), _kw(device="cuda", precision="bf16"),
                        workers=1, gpus=1)
    try:
        m_local, m_gpu, m_bf16 = _train(local, algo, cfg), _train(gpu, algo, cfg), _train(bf16, algo, cfg)
        assert _rel(_params(local.state_dict_for_engines()), _params(gpu.state_dict_for_engines())) < 1e-4
        for a, b_, c in zip(m_local, m_gpu, m_bf16):
            assert abs(a["loss"] - b_["loss"]) <= 1e-4 * max(1.0, abs(a["loss"]))
            assert abs(a["loss"] - c["loss"]) <= 2e-2 * max(1.0, abs(a["loss"]))  # bf16 rounding
    finally:
        gpu.shutdown()
        bf16.shutdown()


# -- end to end: `agentrl train` with learner ranks ------------------------------------------------
TOY = ["env.name=toy", "sft.steps=0", "rollout.tasks_per_step=2", "algo.group_size=2",
       "train.eval_tasks=2", "train.eval_samples=1", "train.steps=3", "train.log_rollouts_every=1",
       "rollout.max_tokens=24", "env.kwargs={words: [x, the, def, return]}", "algo.entropy_coef=0.01",
       "train.prefix_share=false", "quiet=true"]


def _run(tmp_path, name, tiny_model_dir, extra):
    import agentrl.train as train_mod
    from agentrl.config import load_config

    out = tmp_path / name
    cfg = load_config(None, TOY + [f"model.path={tiny_model_dir}", f"out={out}"] + extra)
    train_mod.train(cfg)
    return out


def _ids(out, step):
    import json

    return [json.loads(line)["token_ids"] for line in
            (out / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


def _final(out, steps=3):
    from safetensors.torch import load_file

    return load_file(str(out / "checkpoints" / f"step_{steps}" / "model.safetensors"))


@pytest.mark.parametrize("extra", [
    ["algo.kl_coef=0.05"],  # with the reference model, sharded on the ranks
    ["algo.kl_coef=0.05", "model.lora_r=4"],  # LoRA: adapters trained, merged for the engine
])
def test_train_with_two_learner_ranks_equals_in_process(ray_up, tiny_model_dir, tmp_path, extra):
    local = _run(tmp_path, "local", tiny_model_dir, extra)
    ranks = _run(tmp_path, "ranks", tiny_model_dir, extra + ["train.learner_workers=2",
                                                              "train.learner_cpus=0.5"])
    for s in (1, 2, 3):
        assert _ids(ranks, s) == _ids(local, s)  # the same samples: the pushed weights agree
    ck = ranks / "checkpoints/step_3"
    assert (ck / "dcp").is_dir()
    if "model.lora_r=4" in extra:
        assert (ck / "adapter_model.safetensors").exists()
        return
    assert _rel(_final(local), _final(ranks)) < 1e-5
    AutoModelForCausalLM.from_pretrained(ck)


def test_two_learner_ranks_with_two_rollout_workers(ray_up, tiny_model_dir, tmp_path):
    out = _run(tmp_path, "rw", tiny_model_dir, ["train.learner_workers=2", "train.learner_cpus=0.5",
                                                 "rollout.num_workers=2", "rollout.worker_cpus=0.5"])
    local = _run(tmp_path, "rw_local", tiny_model_dir, [])
    assert _ids(out, 3) == _ids(local, 3)


def test_resume_a_two_rank_run_with_one_rank(ray_up, tiny_model_dir, tmp_path, monkeypatch):
    """A 2-rank run crashes after its step-1 checkpoint; `--resume` with 1 rank (DCP reshards)
    ends with the weights of the uninterrupted 2-rank run."""
    import agentrl.rollout.stages as stages_mod
    import agentrl.train as train_mod
    from agentrl.config import load_config

    base = ["train.learner_workers=2", "train.learner_cpus=0.5", "algo.kl_coef=0.05"]
    whole = _run(tmp_path, "whole", tiny_model_dir, base)
    real = stages_mod.collect

    def crash(*a, **kw):
        if kw["group_base"] == 1 * 2:  # collecting step 2
            raise RuntimeError("injected")
        return real(*a, **kw)

    monkeypatch.setattr(stages_mod, "collect", crash)
    out = tmp_path / "cut"
    cfg = load_config(None, TOY + base + ["train.save_every=1", f"model.path={tiny_model_dir}", f"out={out}"])
    with pytest.raises(RuntimeError, match="injected"):
        train_mod.train(cfg)
    monkeypatch.undo()
    resumed = cfg.model_copy(update={"resume": str(out)})
    resumed.train.learner_workers = 1
    train_mod.train(resumed)
    for s in (2, 3):
        assert _ids(out, s) == _ids(whole, s)
    assert _rel(_final(whole), _final(out)) < 1e-5


@pytest.mark.slow
def test_sigkill_a_two_rank_run_mid_step_then_resume(ray_up, tiny_model_dir, tmp_path):
    """kill -9 of a whole 2-rank job (driver, Ray and both ranks: its process group) while step 2
    runs; `agentrl train --resume OUT` (2 ranks again) continues from the step-1 DCP checkpoint
    and ends with the weights of the uninterrupted 2-rank run (1e-5 of their scale)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    base = ["train.learner_workers=2", "train.learner_cpus=0.5", "algo.kl_coef=0.05"]
    whole = _run(tmp_path, "whole", tiny_model_dir, base)
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "agentrl.cli", "train", *TOY, *base, "train.save_every=1",
           f"model.path={tiny_model_dir}", f"out={out}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)  # its own process group: the job's Ray too
    marker = out / "checkpoints/step_1/agentrl_state.json"
    deadline = time.monotonic() + 400
    try:
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no step-1 checkpoint in time"
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # kill -9 while step 2 runs
        proc.wait(timeout=60)
        proc.stderr.close()
    assert not (out / "checkpoints/step_2").exists(), "the kill came after step 2 finished"
    assert (out / "checkpoints/step_1/dcp").is_dir()
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "train", "--resume", str(out), "-q"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"[resume] from {out / 'checkpoints/step_1'} at step 1" in r.stdout
    for s in (2, 3):
        assert _ids(out, s) == _ids(whole, s)
    assert _rel(_final(whole), _final(out)) < 1e-5
