"""The learning test of distillation that issue #24 asks for: a trained checkpoint teaches the
untrained embedded model on the code env, and the student's held-out pass@1 rises toward the
teacher's. Runs `benchmarks/distill_code_env.py`'s two `agentrl train` runs (a short main job as
the teacher, then `--algo distill` from the untrained model it started from) with GKD's mixture
(`distill_code_env.GKD`: half of each step's tasks played by the teacher, the forward KL on the
student's and the teacher's rows, lr 2e-3, 300 steps); passed in 653 s at da53247 (load ~3 on 2 shared cores; teacher 0.320,
student 0.000 -> 0.311 ± 0.028).

The runs before it did not meet it: the untrained student stayed at held-out pass@1 0.000 after
100 steps with `distill_kl=sampled` (f3d8dc3) and `full`/`forward` at lr 5e-4 / 1e-3 (49e9337;
`full` also after 200). With the mixture it went 0.000 -> 0.311 at step 300 and 0.307 at step 400
(teacher 0.320; 03a70ff); pure on-policy `forward` at the same lr 2e-3 reached 0.270 at step 300
(9597475), so the lr and the steps, more than the mixture, made the difference. Figures in
docs/algorithms.md ("On-policy distillation on the code env")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import distill_code_env  # noqa: E402

MIN_SHARE = 0.5
"""The student must close at least this share of its gap to the teacher's held-out pass@1."""


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 11 min measured at load ~3; the suite's default is 600 s
def test_trained_checkpoint_teaches_the_untrained_model_on_the_code_env(tmp_path):
    r = distill_code_env.run(tmp_path, **distill_code_env.GKD)
    teacher = r["teacher"]["final"]["pass@1"]
    before, after = r["student_before"]["pass@1"], r["student_after"]["pass@1"]
    assert teacher > before + 0.1, r  # the teacher knows something the student does not
    assert after - before >= MIN_SHARE * (teacher - before), r  # the student rises toward it
    assert after - before > 4 * r["student_after"]["pass@1_se"], r  # several standard errors
