"""benchmarks/main_job_seeds.py --check: the README row's parsing and the comparison (the job
itself runs in .ci/run's main-job stage, not here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from main_job_seeds import BEGIN, END, TOLERANCE, check_figures, cpu_fingerprint, readme_row  # noqa: E402

BLOCK = f"""intro
{BEGIN}

Measured by `python benchmarks/main_job_seeds.py --write-readme` on commit `6d72db0`, 2026-12-02 (1 run at a time on 2 cores); held-out: 256 tasks x 4 samples at T=1:

| seed | pass@1 before | pass@1 after | ratio | gain | pass@4 before | pass@4 after | wall |
| --- | --- | --- | --- | --- | --- | --- | --- |
| 0 | 0.263 ± 0.020 | 0.684 ± 0.025 | 2.60x | +0.421 | 0.539 | 0.793 | 21.6 min |
| 1 | 0.266 ± 0.017 | 0.762 ± 0.023 | 2.87x | +0.496 | 0.629 | 0.836 | 10.8 min |

Median ratio 2.60x.

{END}
| 0 | 0.999 ± 0.0 | 0.999 ± 0.0 |
"""


def test_readme_row_reads_the_seed_row_and_the_commit():
    assert readme_row(BLOCK, 0) == {"seed": 0, "before": 0.263, "after": 0.684, "before_se": 0.020,
                                    "after_se": 0.025, "commit": "6d72db0", "cpu": None}
    assert readme_row(BLOCK, 1)["after"] == 0.762
    dirty = BLOCK.replace("`6d72db0`", "`abc1234+dirty`")
    assert readme_row(dirty, 0)["commit"] == "abc1234+dirty"


def test_readme_row_reads_this_readme():
    row = readme_row((ROOT / "README.md").read_text(), 0)
    assert 0 < row["before"] < row["after"] < 1 and len(row["commit"]) >= 7


@pytest.mark.parametrize("text, what", [
    ("no block at all", "no <!-- main_job_seeds:begin -->"),
    (BLOCK.replace("on commit `6d72db0`", "on a day"), "names no commit"),
    (BLOCK.replace("| 0 | 0.263", "| 7 | 0.263"), "no row for seed 0"),
    (BLOCK.replace("| 0 | 0.263 ± 0.020", "| 0 | n/a"), "has no pass@1 before/after"),
])
def test_readme_row_errors_name_what_is_missing(text, what):
    with pytest.raises(ValueError, match=what):
        readme_row(text, 0)


def test_check_figures_within_and_outside_the_tolerance():
    row = readme_row(BLOCK, 0)  # no CPU recorded: compared on "the block's own" when cpu is None
    ok, report = check_figures(row, 0.263, 0.684)
    assert ok and "before 0.263, after 0.684" in report and "6d72db0" in report
    assert check_figures(row, 0.263 + TOLERANCE, 0.684 - TOLERANCE)[0]  # the edge is inside
    ok, report = check_figures(row, 0.316, 0.675)  # issue 43's run: 0.053 and 0.009 off
    assert not ok and "differences 0.053, 0.009" in report and "--write-readme" in report
    assert not check_figures(row, 0.263, 0.684 + 0.011)[0]
    assert not check_figures(row, 0.263 - 0.02, 0.684)[0]
    assert check_figures(row, 0.30, 0.70, tol=0.05)[0]


CPU_A = "x86_64 AuthenticAMD family 25 model 1, ATen AVX2, torch 2.13.0+cpu"
CPU_B = "x86_64 GenuineIntel family 6 model 143, ATen AVX512, torch 2.13.0+cpu"


def test_readme_row_reads_the_cpu_and_a_row_without_standard_errors():
    block = BLOCK.replace("2026-12-02 (", f"2026-12-02, CPU `{CPU_A}` (")
    assert readme_row(block, 0)["cpu"] == CPU_A
    bare = BLOCK.replace("| 0 | 0.263 ± 0.020 | 0.684 ± 0.025", "| 0 | 0.263 | 0.684")
    assert readme_row(bare, 0)["before_se"] is None and readme_row(bare, 0)["after"] == 0.684


def test_check_on_the_blocks_cpu_is_exact_and_on_another_is_a_seeds_spread():
    row = readme_row(BLOCK.replace("2026-12-02 (", f"2026-12-02, CPU `{CPU_A}` ("), 0)
    # issue 43's run (0.316 -> 0.675) on the block's CPU: fails at 0.01
    ok, report = check_figures(row, 0.316, 0.675, cpu=CPU_A)
    assert not ok and "tolerance 0.01" in report and CPU_A in report
    # the same figures from another CPU: 3 x sqrt(2) x SE = 0.0849 (before), 0.1061 (after)
    ok, report = check_figures(row, 0.316, 0.675, cpu=CPU_B)
    assert ok and "0.085 before, 0.106 after" in report and CPU_B in report
    assert check_figures(row, 0.263 + 0.084, 0.684 - 0.106, cpu=CPU_B)[0]
    assert not check_figures(row, 0.263 + 0.086, 0.684, cpu=CPU_B)[0]
    assert not check_figures(row, 0.263, 0.684 - 0.107, cpu=CPU_B)[0]
    # learning broken on another CPU (after falls to the warm start's level) fails
    assert not check_figures(row, 0.263, 0.30, cpu=CPU_B)[0]
    # a row without standard errors on another CPU falls back to the exact tolerance
    bare = readme_row(BLOCK.replace("| 0 | 0.263 ± 0.020 | 0.684 ± 0.025", "| 0 | 0.263 | 0.684"), 0)
    assert not check_figures(bare, 0.316, 0.675, cpu=CPU_B)[0]


def test_cpu_fingerprint_names_the_kernels_and_torch():
    import torch

    fp = cpu_fingerprint()
    assert f"ATen {torch.backends.cpu.get_cpu_capability()}" in fp and torch.__version__ in fp
