"""pass@k (cases E1-E5 and hand-computed rows, n = 1000 against exact fractions), the summary
computed from result rows, and the comparison of two evaluation directories. No model here."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from math import comb

import numpy as np
import pytest

from agentrl.eval import pass_at_k, pass_at_k_many
from agentrl.eval.report import compare, summarize, summary_markdown


def exact(n: int, c: int, k: int) -> Fraction:
    """1 - C(n-c, k) / C(n, k) in exact rational arithmetic (math.comb(m, k) = 0 when k > m)."""
    return 1 - Fraction(comb(n - c, k), comb(n, k))


# (n, c, k, expected): hand-computed, the arithmetic in the comment.
TABLE = [
    (5, 0, 1, 0.0),            # E1: no correct sample
    (5, 2, 2, 0.7),            # E2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    (10, 3, 1, 0.3),           # E3: 1 - C(7,1)/C(10,1) = 1 - 7/10 (= c/n for k = 1)
    (5, 5, 3, 1.0),            # E4: all correct
    (1, 1, 1, 1.0),            # one sample, correct
    (1, 0, 1, 0.0),            # one sample, wrong
    (3, 0, 3, 0.0),            # k = n, nothing correct
    (3, 1, 3, 1.0),            # k = n: the only 3-subset holds the correct one
    (4, 2, 2, 5 / 6),          # 1 - C(2,2)/C(4,2) = 1 - 1/6
    (10, 1, 5, 0.5),           # 1 - C(9,5)/C(10,5) = 1 - 126/252
    (6, 3, 4, 1.0),            # n - c = 3 < k = 4: every 4-subset holds a correct one
    (20, 5, 10, 1 - 3003 / 184756),  # 1 - C(15,10)/C(20,10) = 0.98374613...
    (200, 10, 1, 0.05),        # k = 1: c / n
    (1000, 1, 1, 0.001),       # c / n
    (1000, 3, 500, 1 - (500 * 499 * 498) / (1000 * 999 * 998)),  # product form by hand: 0.875375...
    (1000, 0, 1000, 0.0),
    (1000, 999, 1000, 1.0),
    (1000, 1, 1000, 1.0),      # k = n: the full set holds the correct sample
]


@pytest.mark.parametrize("n,c,k,expected", TABLE)
def test_pass_at_k_table(n, c, k, expected):
    got = pass_at_k(n, c, k)
    assert isinstance(got, float)
    assert got == pytest.approx(expected, abs=1e-12)
    assert got == pytest.approx(float(exact(n, c, k)), abs=1e-12)


def test_pass_at_k_exact_cases_are_exact():
    """E1 and E4 are exactly 0 and 1 (no rounding), E2 to the last bit of 0.7's neighbourhood."""
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert abs(pass_at_k(5, 2, 2) - 0.7) < 1e-15


@pytest.mark.parametrize("c", [0, 1, 2, 7, 50, 123, 500, 900, 990, 999, 1000])
@pytest.mark.parametrize("k", [1, 2, 5, 10, 50, 100, 500, 999, 1000])
def test_pass_at_k_n1000_against_exact_fractions(c, k):
    """n = 1000: the binomials are astronomically large (C(1000, 500) ~ 2.7e299) yet the
    product form agrees with the exact rational value to 1e-12."""
    assert pass_at_k(1000, c, k) == pytest.approx(float(exact(1000, c, k)), abs=1e-12)


def test_pass_at_k_monotone_in_k_and_c():
    vals_k = [pass_at_k(50, 7, k) for k in range(1, 51)]
    assert all(a <= b + 1e-15 for a, b in zip(vals_k, vals_k[1:], strict=False))
    vals_c = [pass_at_k(50, c, 5) for c in range(51)]
    assert all(a <= b + 1e-15 for a, b in zip(vals_c, vals_c[1:], strict=False))


def test_e5_fewer_samples_than_k_raises():
    """E5: (3, 1, 5) has no estimate: an error naming k and n, never a number."""
    with pytest.raises(ValueError, match=r"k=5 > n=3"):
        pass_at_k(3, 1, 5)


@pytest.mark.parametrize("args,err", [
    ((5, 6, 1), ValueError),     # c > n
    ((5, -1, 1), ValueError),    # c < 0
    ((0, 0, 1), ValueError),     # no samples
    ((5, 2, 0), ValueError),     # k < 1
    ((5.0, 2, 1), TypeError),    # float counts are a caller bug
    ((5, 2, 1.5), TypeError),
    ((True, 1, 1), TypeError),   # bools are not counts
])
def test_pass_at_k_rejects_bad_arguments(args, err):
    with pytest.raises(err):
        pass_at_k(*args)


def test_pass_at_k_accepts_numpy_integers():
    assert pass_at_k(np.int64(5), np.int32(2), np.int64(2)) == pytest.approx(0.7)


def test_pass_at_k_many_excludes_and_counts():
    """k = 5: (5, 2) -> n - c = 3 < 5 -> 1.0; (3, 1) has n < k -> excluded; (10, 3) ->
    1 - C(7,5)/C(10,5) = 1 - 21/252 = 11/12."""
    vals, excluded = pass_at_k_many([5, 3, 10], [2, 1, 3], 5)
    assert excluded == 1
    np.testing.assert_allclose(vals, [1.0, 11 / 12], atol=1e-12)
    assert vals.dtype == np.float64


def test_pass_at_k_many_broadcasts_n_and_handles_all_excluded():
    vals, excluded = pass_at_k_many(5, [0, 2, 5], 2)  # 0, 1 - 3/10, 1
    np.testing.assert_allclose(vals, [0.0, 0.7, 1.0], atol=1e-12)
    assert excluded == 0
    vals, excluded = pass_at_k_many([1, 2], [1, 1], 3)
    assert vals.shape == (0,) and excluded == 2


def test_mean_se_over_tasks_by_hand():
    """[1, 0, 1, 0]: mean 0.5, std(ddof=1) = sqrt(1/3), SE = sqrt(1/3) / 2 = 0.288675; one
    value has no SE, none has no mean."""
    from agentrl.eval.metrics import mean_se

    m, se = mean_se([1.0, 0.0, 1.0, 0.0])
    assert m == 0.5 and se == pytest.approx((1 / 3) ** 0.5 / 2, abs=1e-12)
    assert mean_se(np.array([0.3])) == (pytest.approx(0.3), None)
    assert mean_se([]) == (None, None)


def test_pass_at_k_many_errors():
    with pytest.raises(ValueError, match="2 sample counts but 3"):
        pass_at_k_many([5, 5], [1, 2, 3], 1)
    with pytest.raises(ValueError):
        pass_at_k_many([5], [6], 1)  # c > n
    with pytest.raises(ValueError):
        pass_at_k_many([5], [1], 0)


# ---------------------------------------------------------------------------------------------
# summarize / compare on hand-made rows
# ---------------------------------------------------------------------------------------------

def row(task_index, task_id, sample, success, reward, turns=1, tokens=10, verdict=None,
        end="terminated", finish=None, errors=()):
    return {"task_index": task_index, "task_id": task_id, "sample": sample, "success": success,
            "reward": reward, "turns": turns, "tokens": tokens, "total_tokens": tokens + 20,
            "finish_reasons": finish or ["stop"] * turns, "end": end, "verdict": verdict,
            "errors": list(errors)}


def three_task_rows():
    # task a: 2/3 pass; task b: 0/3 (one NaN reward, one error); task c: 3/3
    return [
        row(0, "a", 0, True, 1.0, verdict="pass"),
        row(0, "a", 1, False, 0.0, turns=2, tokens=30, verdict="fail", finish=["stop", "length"]),
        row(0, "a", 2, True, 1.0, verdict="pass"),
        row(1, "b", 0, False, 0.0, verdict="timeout", end="truncated"),
        row(1, "b", 1, False, None, verdict="runtime_error", errors=["step failed: boom"], end="env_error"),
        row(1, "b", 2, False, 0.0, verdict="fail"),
        row(2, "c", 0, True, 1.0, verdict="pass"),
        row(2, "c", 1, True, 1.0, verdict="pass"),
        row(2, "c", 2, True, 1.0, verdict="pass"),
    ]


def test_summarize_hand_computed():
    s = summarize(three_task_rows(), [1, 2, 3])
    o = s["overall"]
    # pass@1 = mean(2/3, 0, 1) = 5/9; pass@2: a: 1 - C(1,2)/C(3,2) = 1, b: 0, c: 1 -> 2/3
    assert o["pass@1"] == pytest.approx(5 / 9)
    assert o["pass@2"] == pytest.approx(2 / 3)
    assert o["pass@3"] == pytest.approx(2 / 3)
    assert o["excluded@1"] == o["excluded@2"] == o["excluded@3"] == 0
    # 8 numeric rewards: 1,0,1,0,0,1,1,1 -> mean 5/8, population std sqrt(5/8 * 3/8)
    assert o["reward_mean"] == pytest.approx(5 / 8)
    assert o["reward_std"] == pytest.approx((15 / 64) ** 0.5)
    assert o["nan_rewards"] == 1
    assert o["episodes"] == 9 and o["tasks"] == 3 and o["successes"] == 5
    assert o["turns_mean"] == pytest.approx(10 / 9)
    assert o["tokens_mean"] == pytest.approx((8 * 10 + 30) / 9)
    assert o["finish_reasons"] == {"length": 1, "stop": 9}
    assert o["end_reasons"] == {"env_error": 1, "terminated": 7, "truncated": 1}
    assert o["verdicts"] == {"fail": 2, "pass": 5, "runtime_error": 1, "timeout": 1}
    assert o["errors"] == 1 and o["error_examples"] == ["step failed: boom"]
    a, b, c = s["tasks"]
    assert (a["task_id"], a["n"], a["c"]) == ("a", 3, 2)
    assert a["pass@1"] == pytest.approx(2 / 3) and a["pass@2"] == 1.0
    assert b["pass@3"] == 0.0 and b["reward_mean"] == 0.0 and b["nan_rewards"] == 1
    assert c["pass@1"] == 1.0


def test_summarize_excludes_tasks_with_too_few_samples():
    """E5 in a summary: a task with n < k gets pass@k None and is counted in excluded@k."""
    rows = [row(0, "a", 0, True, 1.0), row(0, "a", 1, False, 0.0), row(1, "b", 0, True, 1.0)]
    s = summarize(rows, [1, 2])
    assert s["overall"]["excluded@2"] == 1
    assert s["overall"]["pass@2"] == 1.0  # only task a: 1 - C(1,2)/C(2,2) = 1
    assert s["tasks"][1]["pass@2"] is None
    s3 = summarize(rows, [3])
    assert s3["overall"]["pass@3"] is None and s3["overall"]["excluded@3"] == 2
    md = summary_markdown(s3)
    assert "| pass@3 | n/a |" in md and "| excluded@3 | 2 |" in md


def write_run(d, rows, ks):
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summarize(rows, ks)))


def test_compare_flipped_tasks(tmp_path, capsys):
    rows_a = three_task_rows()
    rows_b = [dict(r) for r in rows_a]
    for r in rows_b:
        if r["task_id"] == "b" and r["sample"] == 2:
            r["success"], r["reward"] = True, 1.0  # b: 0/3 -> 1/3 (gained)
        if r["task_id"] == "a":
            r["success"], r["reward"] = False, 0.0  # a: 2/3 -> 0/3 (lost)
    rows_b.append(row(3, "d", 0, True, 1.0))  # only in B
    write_run(tmp_path / "A", rows_a, [1, 2])
    write_run(tmp_path / "B", rows_b, [1, 2])
    res = compare(tmp_path / "A", tmp_path / "B")
    assert res["flipped"] == {"gained": ["b"], "lost": ["a"]}
    assert res["only_a"] == [] and res["only_b"] == ["d"]
    # A: pass@1 = 5/9; B: mean(0, 1/3, 1, 1) = 7/12
    assert res["metrics"]["pass@1"]["a"] == pytest.approx(5 / 9)
    assert res["metrics"]["pass@1"]["b"] == pytest.approx(7 / 12)
    assert res["metrics"]["pass@1"]["diff"] == pytest.approx(7 / 12 - 5 / 9)
    per = {t["task_id"]: t for t in res["tasks"]}
    assert per["a"]["pass@1"]["diff"] == pytest.approx(-2 / 3)
    assert per["b"]["pass@1"]["diff"] == pytest.approx(1 / 3)
    assert per["c"]["pass@1"]["diff"] == 0.0
    from rich.console import Console

    from agentrl.eval.report import print_compare

    console = Console(width=120, record=True)
    print_compare(res, console)
    text = console.export_text()
    assert "gained, 1): b" in text and "lost, 1): a" in text
    # counts differ by whole numbers (B has one more task and episode): `+1`, not `+1.0000`
    assert res["metrics"]["episodes"]["diff"] == 1 and isinstance(res["metrics"]["episodes"]["diff"], int)
    assert re.search(r"episodes\s.*\s\+1\s", text) and "+1.0000" not in text


def test_compare_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="summary.json"):
        compare(tmp_path / "nope", tmp_path / "nope2")


def test_compare_on_a_training_run_names_its_evaluations(tmp_path):
    """`--compare RUN` or `--compare RUN/eval` (the folder the training run's last line names)
    points at the run's own held-out evaluations, RUN/eval/before and RUN/eval/after, instead of
    asking to evaluate into the run's folder."""
    run = tmp_path / "run"
    for side in ("before", "after"):
        write_run(run / "eval" / side, three_task_rows(), [1])
    (run / "summary.json").write_text(json.dumps({"algo": "grpo", "eval_after": {"pass@1": 0.5}}))
    before, after = run / "eval" / "before", run / "eval" / "after"
    want = f"agentrl eval --compare {before} {after}"
    with pytest.raises(ValueError, match="is not an evaluation folder") as e:
        compare(run, after)
    assert want in str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        compare(run / "eval", after)
    assert want in str(e.value) and "--out" not in str(e.value)
    assert compare(before, after)["metrics"]["pass@1"]["diff"] == 0.0
    with pytest.raises(FileNotFoundError, match=r"run `agentrl eval --out"):
        compare(tmp_path / "nope", after)
