"""Learner: tempered logprobs (L4), the update loop (two steps move the parameters with a
finite loss; micro-batching gives the full-batch gradient, L2), checkpoints."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from agentrl.algos import get_algorithm
from agentrl.config import AlgoConfig
from agentrl.learner import Learner, latest_checkpoint, token_logprobs
from agentrl.model import load_model
from agentrl.trajectory import Trajectory


class FixedLogits(torch.nn.Module):
    """A 'model' whose next-token logits are always [2, 1, 0] (one parameter so it can train)."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor([2.0, 1.0, 0.0]))

    def forward(self, input_ids, attention_mask=None):
        B, T = input_ids.shape
        return SimpleNamespace(logits=self.bias.expand(B, T, 3))


def test_l4_learner_uses_tempered_logits_like_the_sampler():
    m = FixedLogits()
    ids = torch.tensor([[1, 0]])  # token 0 sampled after context [1]
    lp_t, _ = token_logprobs(m, ids, torch.ones_like(ids), temperature=0.6)
    lp_raw, _ = token_logprobs(m, ids, torch.ones_like(ids), temperature=1.0)
    sampler = torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]) / 0.6, -1)[0]
    # hand-computed: log_softmax([3.333, 1.667, 0])[0] = -0.202573
    assert lp_t[0, 1].item() == pytest.approx(-0.202573, abs=1e-5)
    assert torch.exp(lp_t[0, 1] - sampler).item() == pytest.approx(1.0, abs=1e-6)  # ratio 1
    # raw logprobs would give the wrong ratio exp(-0.202573 - (-0.407606)) = 1.2276
    assert torch.exp(sampler - lp_raw[0, 1]).item() == pytest.approx(1.2276, abs=1e-4)
    assert lp_t[0, 0].item() == 0.0  # the first token has no context


def test_entropy_matches_definition():
    m = FixedLogits()
    ids = torch.tensor([[1, 0, 2]])
    _, ent = token_logprobs(m, ids, torch.ones_like(ids), with_entropy=True)
    p = torch.softmax(torch.tensor([2.0, 1.0, 0.0]), -1)
    assert ent[0, 1].item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)


def _batch(tok_model, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        t = Trajectory(group_id=i // 2)
        t.append_context(torch.randint(3, 50, (3 + i,), generator=g).tolist())
        t.append_sampled(torch.randint(3, 50, (4 + 2 * i,), generator=g).tolist(), [-3.0] * (4 + 2 * i),
                         reward=float(i % 2))
        trajs.append(t)
    from agentrl.train import build_batch

    return build_batch(trajs, pad_id=0)


def test_two_grpo_steps_move_parameters_with_finite_loss(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = AlgoConfig(name="grpo")
    algo = get_algorithm("grpo")
    learner = Learner(model, lr=1e-2, micro_batch_size=2)
    for step in range(2):
        batch = _batch(model, seed=step)
        batch["advantages"], stats = algo.advantages(batch, cfg)
        m = learner.update(batch, algo, cfg)
        assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    moved = sum(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert moved == len(before)
    assert learner.optimizer_steps == 2


def test_micro_batches_give_the_full_batch_gradient(tiny_model_dir):
    """L2 end to end: micro_batch_size 1 and 4 give the same gradient (token-mean over the
    minibatch's global token count)."""
    cfg = AlgoConfig(name="grpo")
    algo = get_algorithm("grpo")
    grads = []
    for mbs in (1, 4):
        model, _ = load_model(tiny_model_dir)
        learner = Learner(model, lr=0.0 + 1e-12, micro_batch_size=mbs, grad_clip=1e9)
        batch = _batch(model)
        batch["advantages"], _ = algo.advantages(batch, cfg)
        learner.update(batch, algo, cfg)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_multi_epoch_update_recomputes_old_logprobs(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    cfg = AlgoConfig(name="grpo", update_epochs=2, minibatches=2)
    algo = get_algorithm("grpo")
    learner = Learner(model, lr=1e-2, micro_batch_size=2)
    batch = _batch(model)
    batch["advantages"], _ = algo.advantages(batch, cfg)
    m = learner.update(batch, algo, cfg, epochs=2, minibatches=2)
    assert learner.optimizer_steps == 4
    assert "old_logprobs" in batch and batch["old_logprobs"].shape == batch["loss_mask"].shape
    assert m["clipfrac"] >= 0.0


def test_checkpoint_roundtrip_is_atomic(tiny_model_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    model, _ = load_model(tiny_model_dir)
    learner = Learner(model, lr=1e-3, use_ref=True)
    p = learner.save(tmp_path / "checkpoints" / "step_3", tiny_tokenizer, {"step": 3, "policy_version": 3})
    (tmp_path / "checkpoints" / "step_9.tmp").mkdir()  # an interrupted save is never picked
    assert latest_checkpoint(tmp_path) == p
    reloaded = AutoModelForCausalLM.from_pretrained(p)
    for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()):
        assert torch.equal(a, b)
    learner2 = Learner(load_model(p)[0], lr=1e-3, use_ref=True)
    assert learner2.load(p) == {"step": 3, "policy_version": 3}
