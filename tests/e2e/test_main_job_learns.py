"""A guard on learning: a shortened main job (the defaults, seed 0, fewer GRPO steps, a smaller
held-out set) must still lift held-out pass@1 clearly. It fails when a change silently breaks
learning (advantages, masks, the loss, the warm start, the sampler). ~6 min on 2 cores."""

from __future__ import annotations

import pytest

GUARD_STEPS = 120
GUARD_EVAL_TASKS = 128
#: The gain the guard demands. Measured at commit 98c6567 (the defaults of ef67a5e), seed 0,
#: the overrides below: held-out pass@1 0.307 -> 0.555 (+0.248, standard errors 0.029 and
#: 0.033), pass@4 0.625 -> 0.773; 0.15 leaves about two standard errors of the gain as margin.
MIN_GAIN = 0.15


@pytest.mark.slow
def test_shortened_main_job_lifts_heldout_pass_at_1(tmp_path):
    from agentrl.config import load_config
    from agentrl.train import train

    cfg = load_config(None, [f"train.steps={GUARD_STEPS}", f"train.eval_tasks={GUARD_EVAL_TASKS}",
                             "train.log_rollouts_every=0", "log.tensorboard=false", "seed=0",
                             f"out={tmp_path / 'run'}", "quiet=true"])
    s = train(cfg)
    before, after = s["eval_before"]["pass@1"], s["eval_after"]["pass@1"]
    assert after - before >= MIN_GAIN, (before, after)
    assert s["eval_after"]["pass@4"] >= s["eval_before"]["pass@4"] - 0.02, (s["eval_before"], s["eval_after"])
