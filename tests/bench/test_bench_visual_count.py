"""benchmarks/visual_count_learning.py: the paired change of accuracy over the same tasks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from visual_count_learning import paired_change  # noqa: E402


def test_paired_change_hand_computed():
    # d = [+1, 0, 0, -1, 0, +1, 0, 0]: mean 1/8; sum of squares about the mean = 3 - 8/64
    c = paired_change("01010000", "11000100")
    assert (c["up"], c["down"], c["n"]) == (2, 1, 8)
    assert c["diff"] == pytest.approx(0.125)
    sd2 = (3 - 8 * 0.125**2) / 7
    assert c["se"] == pytest.approx((sd2 / 8) ** 0.5)
    assert c["z"] == pytest.approx(0.125 / (sd2 / 8) ** 0.5)
    same = paired_change("0110", "0110")
    assert (same["diff"], same["se"], same["z"]) == (0.0, 0.0, None)
    with pytest.raises(ValueError):
        paired_change("01", "011")
