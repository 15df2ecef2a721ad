"""GKD's mixture in distillation (`algo.distill_teacher_fraction`, Agarwal et al. 2024): the
teacher plays a share of each step's tasks through an in-process hf engine, its tokens kept
exactly as sampled and masked to its generated tokens only, and the token-level KL is applied
to its rows as to the student's. Values by hand on a two-token vocabulary; the start-up
refusals; one real batch on the toy env with a real teacher engine."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from agentrl.algos import get_algorithm
from agentrl.algos.distill import teacher_task_count
from agentrl.config import ConfigError, algo_config, load_config

distill = get_algorithm("distill")


def lg(p):
    return torch.tensor(p, dtype=torch.float32).log()


def test_teacher_task_count_by_hand():
    assert teacher_task_count(0.5, 32) == 16
    assert teacher_task_count(0.0, 32) == 0 and teacher_task_count(1.0, 4) == 4
    assert teacher_task_count(0.25, 3) == 1  # 0.75 -> 1
    assert teacher_task_count(0.5, 3) == 2 and teacher_task_count(0.5, 5) == 2  # halves to even


@pytest.mark.parametrize("extra, key", [
    (["algo.distill_kl=sampled"], "algo.distill_kl=full|topk|forward"),
    (["algo.distill_reward_coef=0.5"], "algo.distill_reward_coef=0"),
    (["algo.dynamic_sampling=true"], "algo.dynamic_sampling=false"),
    (["rollout.mode=async"], "rollout.mode=sync"),
    (["rollout.num_workers=2"], "rollout.num_workers=0"),
    (["train.learner_workers=2"], "train.learner_workers=0"),
])
def test_unsupported_combinations_are_refused_at_start_up(tmp_path, extra, key):
    base = ["algo.name=distill", f"algo.teacher_path={tmp_path}", "algo.distill_kl=forward"]
    assert load_config(None, base + ["algo.distill_teacher_fraction=0.5"]).algo.distill_teacher_fraction == 0.5
    with pytest.raises(ConfigError, match="algo.distill_teacher_fraction=0.5") as e:
        load_config(None, base + ["algo.distill_teacher_fraction=0.5", *extra])
    assert key in str(e.value)
    with pytest.raises(ConfigError, match="not supported by algo.name=grpo; supported by: distill"):
        load_config(None, ["algo.name=grpo", "algo.distill_teacher_fraction=0.5"])
    with pytest.raises(ConfigError, match="distill_teacher_fraction"):
        load_config(None, base + ["algo.distill_teacher_fraction=1.5"])


def test_forward_kl_loss_on_a_teacher_row_by_hand():
    """Row 0 is the student's (one agent token), row 1 the teacher's (two agent tokens after a
    prompt token): distill_coef x the forward KL summed over the three agent tokens / 3; the
    teacher row's prompt position (mask 0) adds nothing."""
    cfg = algo_config(name="distill", teacher_path=".", distill_kl="forward", distill_coef=1.5)
    s1, t1 = lg([0.5, 0.5]), lg([0.25, 0.75])  # KL(t || s) = .25 ln .5 + .75 ln 1.5
    s2, t2 = lg([0.9, 0.1]), lg([0.5, 0.5])  # .5 ln(.5/.9) + .5 ln 5
    s3, t3 = lg([0.2, 0.8]), lg([0.6, 0.4])  # .6 ln 3 + .4 ln .5
    other = lg([0.01, 0.99])  # masked: never read
    stud = torch.stack([torch.stack([other, s1, other]), torch.stack([other, s2, s3])])
    teach = torch.stack([torch.stack([t1, t1, t1]), torch.stack([t2 * 0 + lg([0.99, 0.01]), t2, t3])])
    batch = {"loss_mask": torch.tensor([[0, 1, 0], [0, 1, 1.0]]), "old_logprobs": torch.zeros(2, 3),
             "advantages": torch.zeros(2, 3), "teacher_vocab_logprobs": teach,
             "teacher_rows": torch.tensor([False, True])}
    kl = [0.25 * math.log(0.5) + 0.75 * math.log(1.5), 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5),
          0.6 * math.log(3) + 0.4 * math.log(0.5)]
    loss, m = distill.loss(torch.zeros(2, 3, requires_grad=True), batch, cfg, num_tokens=3.0, num_seqs=2,
                           vocab_logp=stud)
    assert m["distill_kl"] == pytest.approx(sum(kl) / 3, abs=1e-6)
    assert loss.item() == pytest.approx(1.5 * sum(kl) / 3, abs=1e-6)


def test_reverse_kl_statistic_reads_the_students_rows_only():
    # row 0 (student): log p_s - log p_t = [0.5, -1.0] -> mean -0.25; row 1 (teacher): ignored
    batch = {"loss_mask": torch.tensor([[0, 1, 1.0], [0, 1, 1.0]]),
             "old_logprobs": torch.tensor([[0, -1.0, -2.0], [0, -5.0, -5.0]]),
             "teacher_logprobs": torch.tensor([[0, -1.5, -1.0], [0, -0.1, -0.1]]),
             "scores": torch.tensor([0.0, 1.0]), "group_ids": torch.tensor([0, 1]),
             "teacher_rows": torch.tensor([False, True])}
    _, stats = distill.advantages(batch, algo_config(name="distill", teacher_path=".", distill_kl="forward"))
    assert stats["reverse_kl"] == pytest.approx(-0.25)


TOY = ["env.name=toy", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
       "model.intermediate_size=64", "model.vocab_size=300", "sft.steps=0",
       "rollout.tasks_per_step=4", "algo.group_size=2", "rollout.max_tokens=6",
       "train.eval_tasks=2", "train.eval_samples=1", "train.steps=1", "train.log_rollouts_every=0",
       "train.torch_threads=1", "rollout.torch_threads=1", "quiet=true", "seed=0",
       "log.tensorboard=false", "algo.name=distill", "algo.distill_kl=forward"]


def test_teacher_rows_of_a_real_batch_on_the_toy_env(tmp_path):
    """`run_batch` with fraction 0.25 of 4 tasks: 3 student tasks then 1 teacher task (x 2
    episodes); the teacher's tokens are exactly those its engine samples for those tasks and
    seeds (token-in / token-out), and not the student's; their loss_mask is 1 on the sampled
    turns only; `prepare` finds the engine's sampler log-probabilities equal to the inline
    teacher's (same tokens, same weights) and hands the learner the student's on those rows."""
    from agentrl.algos.shaping import build_batch
    from agentrl.models.tiny import load_model
    from agentrl.rollout.collect import collect
    from agentrl.rollout.envs import build_env
    from agentrl.rollout.stages import held_version, run_batch, task_seeds
    from agentrl.run import build, default_model_dir, teacher_engine
    from agentrl.train import build_loop

    base = default_model_dir(load_config(None, TOY[:-2]), tmp_path / "base")
    teacher, tok = load_model(base)  # another random init, same tokenizer
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in teacher.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    teacher.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    cfg = load_config(None, TOY + [f"model.path={base}", f"algo.teacher_path={tmp_path / 'teacher'}",
                                   "algo.distill_teacher_fraction=0.25", f"out={tmp_path / 'run'}"])
    run = build(cfg)
    cfg, tok, renderer = run.cfg, run.tok, run.renderer
    lp = build_loop(run, say=lambda s: None)
    trajs = run_batch(lp, 0)
    assert len(trajs) == 8
    rows = [t.info.get("sampler") == "teacher" for t in trajs]
    assert rows == [False] * 6 + [True] * 2
    assert all(t.policy_version == held_version(lp) for t in trajs)
    assert sorted({t.group_id for t in trajs}) == [0, 1, 2, 3]
    # the same task and sampling seeds through a fresh teacher engine, and through the student's
    seeds = task_seeds(cfg, 0)[3:]
    kw = dict(group_base=3, sample_seed=(cfg.seed * 100_003) * 31 + 7)
    with ThreadPoolExecutor(2) as pool:
        ref = collect(teacher_engine(cfg, tok), renderer, [build_env(cfg, "train") for _ in range(2)],
                      seeds, 2, lp.params, cfg, pool, **kw)
        stu = collect(lp.engine, renderer, [build_env(cfg, "train") for _ in range(2)],
                      seeds, 2, lp.params, cfg, pool, **kw)
    for t, r in zip(trajs[6:], ref):
        assert t.token_ids == r.token_ids and t.loss_mask == r.loss_mask
        assert t.sampler_logprobs == r.sampler_logprobs
        spans = {i for turn in t.turns for i in range(turn.start, turn.end)}
        assert t.loss_mask == [int(i in spans) for i in range(len(t.token_ids))]
        assert 0 < sum(t.loss_mask) < len(t.token_ids)
    assert [t.token_ids for t in trajs[6:]] != [s.token_ids for s in stu]  # the teacher, not the student
    batch = build_batch(trajs, lp.pad_id)
    assert batch["teacher_rows"].tolist() == rows
    slp = batch["sampler_logprobs"].clone()
    batch, stats = distill.prepare(batch, lp.learner, cfg.algo)
    assert stats["teacher_rows"] == 2.0
    assert stats["teacher_sampler_gap"] < 1e-5, stats  # the engine's logprobs = the inline teacher's
    assert torch.equal(batch["teacher_sampler_logprobs"], slp)
    assert torch.equal(batch["sampler_logprobs"][6:], batch["old_logprobs"][6:])
    assert torch.equal(batch["sampler_logprobs"][:6], slp[:6])
    m = batch["loss_mask"][6:] != 0
    fwd = (batch["teacher_logprobs"][6:] - batch["old_logprobs"][6:])[m].mean()
    assert stats["forward_kl_teacher_rows"] == pytest.approx(float(fwd), abs=1e-6)
    batch["advantages"], _ = distill.advantages(batch, cfg.algo)
    upd = lp.learner.update(batch, distill, cfg.algo)
    assert upd["distill_kl"] > 0.01, upd
