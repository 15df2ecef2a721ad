"""Learning-rate schedules: values by hand, and the learner's optimizer following them."""

from __future__ import annotations

import math

import pytest

from agentrl.learner.schedules import lr_multiplier


def test_warmup_then_constant_by_hand():
    # warmup 3: steps 0, 1, 2 use 1/4, 2/4, 3/4; then 1
    assert [lr_multiplier(s, warmup=3) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert lr_multiplier(0) == 1.0  # no warm-up: the first step uses the full lr


def test_linear_and_cosine_decay_by_hand():
    kw = {"warmup": 2, "total": 12, "min_ratio": 0.1}
    # linear: p = (step - 2) / 10; factor 1 - 0.9 p
    assert lr_multiplier(2, schedule="linear", **kw) == pytest.approx(1.0)
    assert lr_multiplier(7, schedule="linear", **kw) == pytest.approx(0.55)
    assert lr_multiplier(12, schedule="linear", **kw) == pytest.approx(0.1)
    assert lr_multiplier(50, schedule="linear", **kw) == pytest.approx(0.1)  # stays at the floor
    # cosine: 0.1 + 0.9 (1 + cos(pi p)) / 2; p = 0.5 -> 0.55, p = 0.25 -> 0.1 + 0.45 (1 + 0.70711)
    assert lr_multiplier(7, schedule="cosine", **kw) == pytest.approx(0.55)
    assert lr_multiplier(4.5, schedule="cosine", **kw) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))
    assert lr_multiplier(12, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_multiplier(1, schedule="cosine", **kw) == pytest.approx(2 / 3)  # still warming up
    assert lr_multiplier(5, schedule="cosine", warmup=5, total=5) == 1.0  # nothing left to decay


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="unknown 'step'"):
        lr_multiplier(0, schedule="step")
    with pytest.raises(ValueError, match="min_ratio"):
        lr_multiplier(0, min_ratio=1.5)
    with pytest.raises(ValueError, match=">= 0"):
        lr_multiplier(-1)


def test_learner_optimizer_follows_the_run_schedule(tiny_model_dir):
    """train.lr_schedule / lr_warmup_steps reach the optimizer: lr per optimizer step."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.config import load_config
    from agentrl.learner.local import Learner
    from agentrl.run import lr_schedule

    cfg = load_config(None, ["train.lr=0.01", "train.steps=4", "train.lr_warmup_steps=1",
                             "train.lr_schedule=linear", "train.lr_min_ratio=0.5"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lrn = Learner(model, lr=cfg.train.lr, lr_schedule=lr_schedule(cfg))
    seen = []
    for _ in range(5):
        seen.append(lrn.optimizer.param_groups[0]["lr"])
        lrn.optimizer.zero_grad()
        sum(p.sum() for p in model.parameters()).backward()
        lrn.optimizer.step()
        lrn.scheduler.step()
    # warm-up step 0: 1/2; then linear from 1 (step 1) to 0.5 (step 4): 1, 5/6, 2/3, 1/2
    assert seen == pytest.approx([0.005, 0.01, 0.01 * 5 / 6, 0.01 * 2 / 3, 0.005])
    assert torch.isfinite(next(model.parameters())).all()
