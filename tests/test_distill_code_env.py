"""The learning test of on-policy distillation that issue #24 asks for: a trained checkpoint
teaches the untrained embedded model on the code env, and the student's held-out pass@1 rises
toward the teacher's. Runs `benchmarks/distill_code_env.py`'s two `agentrl train` runs (a short
main job as the teacher, then `--algo distill` from the untrained model it started from);
~10-12 min on 2 cores.

Not met today (strict xfail, so that it is noticed the day it passes), neither with the default
sampled-token signal nor with the exact per-token KL (`algo.distill_kl=full`, `forward`;
`benchmarks/distill_code_env.py --distill-kl`): see the figures in docs/algorithms.md
("On-policy distillation on the code env")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import distill_code_env  # noqa: E402

MIN_SHARE = 0.5
"""The student must close at least this share of its gap to the teacher's held-out pass@1."""


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue #24's open target, not met yet: the untrained student "
                   "stays at held-out pass@1 0.000 after 100 distill steps with algo.distill_kl="
                   "sampled (f3d8dc3) and full/forward (49e9337; full also after 200), figures in "
                   "docs/algorithms.md; strict, so this fails the day distillation teaches")
def test_trained_checkpoint_teaches_the_untrained_model_on_the_code_env(tmp_path):
    r = distill_code_env.run(tmp_path)
    teacher = r["teacher"]["final"]["pass@1"]
    before, after = r["student_before"]["pass@1"], r["student_after"]["pass@1"]
    assert teacher > before + 0.1, r  # the teacher knows something the student does not
    assert after - before >= MIN_SHARE * (teacher - before), r  # the student rises toward it
