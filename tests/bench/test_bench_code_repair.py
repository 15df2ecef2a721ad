"""benchmarks/code_repair.py's table and step profile against hand-computed values: the gap
(pass within 3 minus first attempt), the repair-rate ratio, a single-turn row (its pass@1 is the
first attempt's; no pass within 3, gap or repair rate), and the per-step means of metrics.jsonl."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from code_repair import curve, curve_table, step_profile, table  # noqa: E402

PROFILE = {"generate_s": 3.0, "env_s": 2.0, "update_s": 5.0, "turns": 1.75}


def test_multi_turn_row_has_gap_and_repair_ratio():
    run = {"arm": "gigpo", "seed": 1, "sft_steps": 400, "wall_s": 600.0, "step_profile": PROFILE,
           "before": {"first_attempt_pass@1": 0.3, "first_attempt_pass@1_se": 0.02, "pass@1": 0.4,
                      "pass@1_se": 0.021, "repair_rate": 0.125, "repair_rate_se": 0.01},
           "after": {"first_attempt_pass@1": 0.5, "first_attempt_pass@1_se": 0.025, "pass@1": 0.625,
                     "pass@1_se": 0.024, "repair_rate": 0.25, "repair_rate_se": 0.02}}
    row = table([run]).splitlines()[-1]
    assert row == ("| gigpo | 1 | 400 | 0.300 ± 0.020 -> 0.500 ± 0.025 | 0.400 ± 0.021 -> 0.625 ± 0.024 | "
                   "0.125 | 0.125 ± 0.010 -> 0.250 ± 0.020 | 2.00x | 10.0 min | 3.00 / 2.00 / 5.00 (1.75) |")


def test_single_turn_row_shows_its_pass_at_1_as_the_first_attempt():
    run = {"arm": "single_turn", "seed": 0, "sft_steps": 260, "wall_s": 120.0, "step_profile": {**PROFILE, "turns": 1.0},
           "before": {"pass@1": 0.263, "pass@1_se": 0.02, "first_attempt_pass@1": None},
           "after": {"pass@1": 0.684, "pass@1_se": 0.025, "first_attempt_pass@1": None}}
    row = table([run]).splitlines()[-1]
    assert row == ("| single_turn | 0 | 260 | 0.263 ± 0.020 -> 0.684 ± 0.025 | – -> – | – | – -> – | – | "
                   "2.0 min | 3.00 / 2.00 / 5.00 (1.00) |")


def test_step_profile_means_over_step_rows_only(tmp_path):
    rows = [{"step": 0, "eval/pass@1": 0.3},  # an evaluation row: not a step
            {"step": 1, "perf/step_s": 10.0, "perf/generate_s": 4.0, "perf/env_s": 2.0, "perf/update_s": 4.0,
             "rollout/turns": 2.0},
            {"step": 2, "perf/step_s": 12.0, "perf/generate_s": 5.0, "perf/env_s": 3.0, "perf/update_s": 4.0,
             "rollout/turns": 1.5}]
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prof = step_profile(p)
    assert prof == {"generate_s": 4.5, "env_s": 2.5, "update_s": 4.0, "step_s": 11.0, "turns": 1.75, "steps": 2}


def test_no_repair_rate_before_gives_no_ratio():
    """summary.json keeps an undefined repair rate (no failed first attempt) as NaN (the
    evaluation's None logged under eval/): the ratio is then `–`, not `nanx`."""
    nan = float("nan")
    run = {"arm": "gigpo", "seed": 0, "sft_steps": 400, "wall_s": 60.0, "step_profile": PROFILE,
           "before": {"first_attempt_pass@1": 1.0, "first_attempt_pass@1_se": 0.0, "pass@1": 1.0,
                      "pass@1_se": 0.0, "repair_rate": nan, "repair_rate_se": nan},
           "after": {"first_attempt_pass@1": 0.5, "first_attempt_pass@1_se": 0.1, "pass@1": 0.75,
                     "pass@1_se": 0.1, "repair_rate": 0.5, "repair_rate_se": nan}}
    cells = [c.strip() for c in table([run]).splitlines()[-1].split("|")]
    assert cells[6:9] == ["0.250", "– -> 0.500", "–"]  # gap 0.75 - 0.5; repair rate; ratio
    run["before"]["repair_rate"], run["after"]["repair_rate"] = 0.25, nan
    cells = [c.strip() for c in table([run]).splitlines()[-1].split("|")]
    assert cells[7:9] == ["0.250 -> –", "–"]


def test_curve_reads_the_evaluations_in_step_order(tmp_path):
    """`curve` keeps the rows holding a held-out evaluation (before RL at step 0, mid-run, after
    at the last step), in step order, with the first attempt, pass within 3 and repair rate."""
    ev = {"eval/first_attempt_pass@1": 0.5, "eval/first_attempt_pass@1_se": 0.02, "eval/pass@1": 0.625,
          "eval/pass@1_se": 0.03, "eval/repair_rate": 0.25, "eval/repair_rate_se": 0.04}
    rows = [{"step": 40, **ev, "eval/pass@1": 0.7}, {"step": 0, **ev},
            {"step": 1, "perf/step_s": 3.0, "rollout/pass_rate": 0.9}, {"step": 80, **ev, "eval/repair_rate": None}]
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = curve(p)
    assert [r["step"] for r in c] == [0, 40, 80]
    assert c[1] == {"step": 40, "first_attempt_pass@1": 0.5, "first_attempt_pass@1_se": 0.02, "pass@1": 0.7,
                    "pass@1_se": 0.03, "repair_rate": 0.25, "repair_rate_se": 0.04}
    assert c[2]["repair_rate"] is None


def test_curve_table_has_the_gap_per_evaluation_and_is_empty_without_mid_run_ones():
    pt = {"first_attempt_pass@1": 0.5, "first_attempt_pass@1_se": 0.02, "pass@1": 0.625, "pass@1_se": 0.03,
          "repair_rate": 0.25, "repair_rate_se": 0.04}
    run = {"arm": "gigpo", "seed": 2, "curve": [{"step": 0, **pt}, {"step": 40, **pt, "pass@1": 0.75},
                                                 {"step": 80, **pt, "repair_rate": None, "repair_rate_se": None}]}
    lines = curve_table([run]).splitlines()
    assert lines[2] == "| gigpo | 2 | 0 | 0.500 ± 0.020 | 0.625 ± 0.030 | 0.125 | 0.250 ± 0.040 |"
    assert lines[3] == "| gigpo | 2 | 40 | 0.500 ± 0.020 | 0.750 ± 0.030 | 0.250 | 0.250 ± 0.040 |"
    assert lines[4] == "| gigpo | 2 | 80 | 0.500 ± 0.020 | 0.625 ± 0.030 | 0.125 | – |"
    assert curve_table([{**run, "curve": run["curve"][:2]}]) == ""  # before and after only: no table
