"""Distillation's exact per-token reverse KL (`algo.distill_kl=full|topk`, issue #24): values by
hand on small vocabularies, zero loss and zero gradient for equal distributions, all-masked rows,
the top-k bound, and the learner / config wiring."""

from __future__ import annotations

import math

import pytest
import torch
from test_algorithm_options import _trajs  # the same four two-group trajectories

from agentrl.algos import get_algorithm
from agentrl.algos.distill import full_forward_kl, full_reverse_kl, topk_reverse_kl
from agentrl.config import ConfigError, algo_config, load_config

distill = get_algorithm("distill")


def lg(p):
    return torch.tensor(p, dtype=torch.float32).log()


def test_full_reverse_kl_by_hand_on_two_tokens():
    # p_s = [1/2, 1/2], p_t = [1/4, 3/4], T = 1:
    # KL = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3) = 0.1438410
    s, te = lg([[[0.5, 0.5]]]), lg([[[0.25, 0.75]]])
    assert full_reverse_kl(s, te).item() == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    # the other direction is another number: reverse KL, not forward
    assert full_reverse_kl(te, s).item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-6)


def test_full_forward_kl_by_hand_and_its_gradient():
    # p_s = [1/2, 1/2], p_t = [1/4, 3/4]: KL(p_t || p_s) = 1/4 ln(1/2) + 3/4 ln(3/2) = 0.1308121
    s, te = lg([[[0.5, 0.5]]]), lg([[[0.25, 0.75]]])
    assert full_forward_kl(s, te).item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-6)
    # d/dz = p_s - p_t (cross-entropy to soft labels)
    z = torch.tensor([[[0.0, 1.0, -1.0]]], requires_grad=True)
    q = lg([[[0.2, 0.5, 0.3]]])
    full_forward_kl(torch.log_softmax(z, -1), q).sum().backward()
    assert torch.allclose(z.grad, torch.softmax(z.detach(), -1) - q.exp(), atol=1e-6)
    zz = torch.randn(2, 3, 5, requires_grad=True)
    k = full_forward_kl(torch.log_softmax(zz, -1), torch.log_softmax(zz, -1).detach())
    k.sum().backward()
    assert torch.allclose(k.detach(), torch.zeros(2, 3), atol=1e-6)
    assert torch.allclose(zz.grad, torch.zeros_like(zz), atol=1e-6)


def test_full_reverse_kl_gradient_by_hand():
    # d KL / d z_i = p_i * ((ln p_i - ln q_i) - KL) for the student's logits z (p = softmax z)
    z = torch.tensor([[[0.0, 1.0, -1.0]]], requires_grad=True)
    q = lg([[[0.2, 0.5, 0.3]]])
    kl = full_reverse_kl(torch.log_softmax(z, -1), q)
    kl.sum().backward()
    p = torch.softmax(z.detach(), -1)
    exp = p * ((p.log() - q) - kl.detach()[..., None])
    assert torch.allclose(z.grad, exp, atol=1e-6)


def test_equal_distributions_give_zero_kl_and_zero_gradient():
    z = torch.randn(2, 3, 7, requires_grad=True)
    for f in (lambda ls: full_reverse_kl(ls, ls.detach()),
              lambda ls: topk_reverse_kl(ls, *ls.detach().topk(3, -1))):
        z.grad = None
        k = f(torch.log_softmax(z, -1))
        k.sum().backward()
        assert torch.allclose(k.detach(), torch.zeros(2, 3), atol=1e-6)
        assert torch.allclose(z.grad, torch.zeros_like(z), atol=1e-6)


def test_topk_reverse_kl_by_hand_and_bound():
    # p_s = [.5, .3, .2], p_t = [.6, .3, .1]; the teacher's top 1 is token 0, rest = {1, 2}:
    # KL^1 = .5 ln(.5/.6) + .5 ln(.5/.4) = 0.0204146; full = .5 ln(5/6) + .2 ln 2 = 0.0474693
    s, te = lg([[[0.5, 0.3, 0.2]]]), lg([[[0.6, 0.3, 0.1]]])
    v, i = te.topk(1, -1)
    assert i.item() == 0
    assert topk_reverse_kl(s, v, i).item() == pytest.approx(0.5 * math.log(5 / 6) + 0.5 * math.log(1.25), abs=1e-6)
    assert full_reverse_kl(s, te).item() == pytest.approx(0.5 * math.log(5 / 6) + 0.2 * math.log(2), abs=1e-6)
    # random: top-k <= full, equal at k = V
    g = torch.Generator().manual_seed(0)
    s = torch.log_softmax(torch.randn(3, 4, 11, generator=g), -1)
    te = torch.log_softmax(torch.randn(3, 4, 11, generator=g), -1)
    full = full_reverse_kl(s, te)
    for k in (1, 4, 10):
        assert torch.all(topk_reverse_kl(s, *te.topk(k, -1)) <= full + 1e-5)  # k = V - 1: equal
    assert torch.allclose(topk_reverse_kl(s, *te.topk(11, -1)), full, atol=1e-5)


def _batch(mask):
    B, T = len(mask), len(mask[0])
    return {"loss_mask": torch.tensor(mask, dtype=torch.float32),
            "old_logprobs": torch.zeros(B, T), "advantages": torch.zeros(B, T)}


def test_loss_token_mean_and_all_masked_rows():
    """distill.loss with distill_kl=full: distill_coef x sum of KL_t over agent tokens / num_tokens;
    an all-masked row and masked positions (t = 0, padding) add nothing."""
    cfg = algo_config(name="distill", teacher_path=".", distill_kl="full", distill_coef=2.0)
    s1, t1 = lg([0.5, 0.5]), lg([0.25, 0.75])  # KL 0.5 ln(4/3)
    s2, t2 = lg([0.9, 0.1]), lg([0.5, 0.5])  # KL .9 ln 1.8 + .1 ln .2
    kl2 = 0.9 * math.log(1.8) + 0.1 * math.log(0.2)
    other = lg([0.01, 0.99])  # a masked position: any value, never read
    stud = torch.stack([torch.stack([other, s1, s2]), torch.stack([other, other, other])])
    teach = torch.stack([torch.stack([t1 * 0, t1, t2]), torch.stack([t1, t2, t1])])
    batch = _batch([[0, 1, 1], [0, 0, 0]])
    batch["teacher_vocab_logprobs"] = teach
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, m = distill.loss(logp, batch, cfg, num_tokens=2.0, num_seqs=2, vocab_logp=stud)
    exp = (0.5 * math.log(4 / 3) + kl2) / 2
    assert m["distill_kl"] == pytest.approx(exp, abs=1e-6)
    assert loss.item() == pytest.approx(2.0 * exp, abs=1e-6)  # the surrogate of A = 0 is 0
    # every row masked: loss 0, finite
    b0 = _batch([[0, 0, 0], [0, 0, 0]])
    b0["teacher_vocab_logprobs"] = teach
    loss0, m0 = distill.loss(logp, b0, cfg, num_tokens=1.0, num_seqs=2, vocab_logp=stud)
    assert loss0.item() == 0.0 and m0["distill_kl"] == 0.0


def test_advantages_are_zero_in_full_mode_and_rows_are_never_idle():
    batch = {"loss_mask": torch.tensor([[0, 1, 1.0]]), "old_logprobs": torch.tensor([[0, -1.0, -2.0]]),
             "teacher_logprobs": torch.tensor([[0, -0.5, -3.0]]), "scores": torch.tensor([1.0]),
             "group_ids": torch.tensor([0])}
    for mode in ("full", "topk", "forward"):
        cfg = algo_config(name="distill", teacher_path=".", distill_kl=mode)
        adv, stats = distill.advantages(batch, cfg)
        assert torch.all(adv == 0) and stats["reverse_kl"] == pytest.approx(0.25)
        assert distill.idle_zero_advantage_rows(cfg) is False and distill.wants_vocab_logprobs(cfg)
    assert not distill.wants_vocab_logprobs(algo_config(name="distill", teacher_path="."))


def test_worker_teacher_with_a_vocab_kl_is_refused_at_start_up(tmp_path):
    for mode in ("full", "topk", "forward"):
        with pytest.raises(ConfigError, match=f"placement.teacher=worker with algo.distill_kl={mode}"):
            load_config(None, ["algo.name=distill", f"algo.teacher_path={tmp_path}",
                               "placement.teacher=worker", f"algo.distill_kl={mode}"])
    with pytest.raises(ConfigError, match="distill_kl"):
        load_config(None, ["algo.name=distill", f"algo.teacher_path={tmp_path}", "algo.distill_kl=backward"])


@pytest.mark.parametrize("mode", ["full", "topk", "forward"])
def test_prepare_and_update_with_the_teacher_equal_to_the_student(tiny_model_dir, tmp_path, mode):
    """Teacher = student: KL 0 and a zero gradient (to float32 rounding); another teacher:
    KL > 0, and updates move the weights and lower the KL."""
    from conftest import TINY_TEXTS

    from agentrl.algos.shaping import build_batch
    from agentrl.learner.frozen import frozen_logprobs, inline_teacher
    from agentrl.learner.local import Learner
    from agentrl.models.tiny import build_tiny_model, load_model

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-2, micro_batch_size=2)
    cfg = load_config(None, ["algo.name=distill", f"algo.teacher_path={tiny_model_dir}",
                             f"algo.distill_kl={mode}", "algo.distill_topk=5"]).algo
    learner.teacher = inline_teacher(cfg.teacher_path, learner)  # as run.build sets it
    batch, _ = distill.prepare(build_batch(_trajs(), pad_id=0), learner, cfg)
    key = "teacher_topk_logprobs" if mode == "topk" else "teacher_vocab_logprobs"
    assert batch[key].shape[:2] == batch["input_ids"].shape
    # the teacher's sampled-token logprobs are frozen_logprobs' (float32 rounding)
    ref = frozen_logprobs(load_model(tiny_model_dir)[0], batch["input_ids"], batch["attention_mask"],
                          batch["lengths"], micro_batch_size=2)
    assert torch.allclose(batch["teacher_logprobs"], ref, atol=1e-5)
    batch["advantages"], _ = distill.advantages(batch, cfg)
    before = [p.detach().clone() for p in model.parameters()]
    m = learner.update(batch, distill, cfg)
    # float32 rounding only (AdamW would still turn it into a step of lr's size)
    assert m["distill_kl"] == pytest.approx(0.0, abs=1e-6) and m["grad_norm"] < 1e-5, m
    # a different teacher (other initial weights, same tokenizer)
    other = build_tiny_model(tmp_path / "other", TINY_TEXTS, hidden_size=32, num_layers=2, num_heads=2,
                             intermediate_size=64, vocab_size=400, seed=1)
    cfg2 = cfg.model_copy(update={"teacher_path": str(other)})
    learner.teacher = inline_teacher(cfg2.teacher_path, learner)
    kls = []
    for _ in range(3):
        b, _ = distill.prepare(build_batch(_trajs(), pad_id=0), learner, cfg2)
        b["advantages"], _ = distill.advantages(b, cfg2)
        kls.append(learner.update(b, distill, cfg2)["distill_kl"])
    # two near-uniform random models: top 5 + the rest sees little of their difference
    assert kls[0] > (1e-4 if mode == "topk" else 0.01) and kls[-1] < kls[0], kls
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
