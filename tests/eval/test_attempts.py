"""Repair metrics (agentrl/eval/attempts.py) against values computed by hand from a fixed
table of episode outcomes; single-turn summaries carry none of them."""

from __future__ import annotations

import math
import statistics

import pytest

from agentrl.eval.attempts import (
    attempt_metrics,
    independent_metrics,
    ratio_se,
    step_attempt_metrics,
)
from agentrl.eval.harness import training_metrics, write_outputs
from agentrl.eval.report import compare, overall_rows, summarize, summary_markdown
from agentrl.types import Trajectory, Turn

P, F = "pass", "fail"
# task index -> the verdicts of each episode's attempts (max 3 attempts)
TABLE = {
    0: [[P], [F, P], [F, F, F], [F, P]],      # first pass 1/4; failed first 3, repaired 2
    1: [[P], [P], [F, F, P], [F, F, F]],      # first pass 2/4; failed first 2, repaired 1
    2: [[F, F, F]] * 4,                       # first pass 0/4; failed first 4, repaired 0
}


def rows() -> list[dict]:
    out = []
    for ti, eps in TABLE.items():
        for j, vs in enumerate(eps):
            out.append({"task_index": ti, "task_id": f"t{ti}", "sample": j, "success": vs[-1] == P,
                        "reward": float(vs[-1] == P), "turns": len(vs), "tokens": 10 * len(vs),
                        "total_tokens": 50, "finish_reasons": ["stop"] * len(vs), "end": "terminated",
                        "verdict": vs[-1], "errors": [], "turn_verdicts": list(vs),
                        "turn_rewards": [float(v == P) for v in vs]})
    return out


def test_attempt_metrics_by_hand():
    m = attempt_metrics(rows())
    # first-attempt pass@1: mean(1/4, 2/4, 0) = 0.25; se = std([.25, .5, 0], ddof=1) / sqrt(3)
    assert m["first_attempt_pass@1"] == pytest.approx(0.25)
    assert m["first_attempt_pass@1_se"] == pytest.approx(0.25 / math.sqrt(3))
    # repair rate: (2 + 1 + 0) / (3 + 2 + 4) = 1/3; residuals y - x/3 = 1, 1/3, -4/3:
    # se = sqrt((1 + 1/9 + 16/9) / (3 * 2)) / mean(x) = sqrt(26/54) / 3
    assert m["repair_rate"] == pytest.approx(1 / 3)
    assert m["repair_rate_se"] == pytest.approx(math.sqrt(26 / 54) / 3)
    assert (m["first_attempt_failures"], m["repaired"]) == (9, 3)
    assert m["attempts_mean"] == pytest.approx(28 / 12)


def test_ratio_se_edges():
    assert ratio_se([0, 0], [0, 0]) is None  # no first-attempt failure: no repair rate
    assert ratio_se([3], [1]) is None  # one task: no spread
    assert ratio_se([2, 2], [1, 1]) == 0.0  # the same share everywhere
    m = attempt_metrics([r for r in rows() if r["task_index"] == 1 and r["turn_verdicts"][0] == P])
    assert m["repair_rate"] is None and m["repair_rate_se"] is None
    assert m["first_attempt_pass@1"] == 1.0


def test_summary_carries_them_only_when_multi_turn():
    s = summarize(rows(), [1, 4], {"max_turns": 3})
    o = s["overall"]
    assert o["pass@1"] == pytest.approx((0.75 + 0.75 + 0) / 3)  # pass within 3 attempts
    assert o["repair_rate"] == pytest.approx(1 / 3)
    flat = training_metrics(s)
    assert flat["first_attempt_pass@1"] == pytest.approx(0.25) and flat["repair_rate"] == pytest.approx(1 / 3)
    single = [{**r, "turns": 1, "turn_verdicts": r["turn_verdicts"][:1]} for r in rows()]
    o1 = summarize(single, [1], {})["overall"]
    assert "repair_rate" not in o1 and "first_attempt_pass@1" not in o1
    assert "repair_rate" not in training_metrics(summarize(single, [1], {}))
    assert "feedback_gain" not in o1 and flat["feedback_gain"] == pytest.approx(-0.25 / 3)


def test_against_as_many_attempts_without_feedback_by_hand():
    """k = 3 fresh first attempts per task, from TABLE's first attempts (Chen et al.'s pass@k):
    task 0 (n 4, c 1): pass@3 = 1 - C(3,3)/C(4,3) = 3/4, with feedback 3/4 solved: gain 0;
    task 1 (c 2): pass@3 = 1 (any 3 of 4 hold a pass), with feedback 3/4: gain -1/4;
    task 2 (c 0): 0 and 0. Repair by 2 fresh attempts from the other 3: task 0's 3 failures
    pass@2(3, 1) = 1 - C(2,2)/C(3,2) = 2/3 each, task 1's 2 failures pass@2(3, 2) = 1, task 2's
    4 failures 0: (3 * 2/3 + 2) / 9 = 4/9 (the feedback's repair rate: 3/9)."""
    m = independent_metrics(rows(), 3)
    assert m["independent_k"] == 3 and m["independent_excluded"] == 0
    assert m["independent_pass"] == pytest.approx(1.75 / 3)
    assert m["independent_pass_se"] == pytest.approx(statistics.stdev([0.75, 1.0, 0.0]) / math.sqrt(3))
    assert m["feedback_gain"] == pytest.approx(-0.25 / 3)
    assert m["feedback_gain_se"] == pytest.approx(statistics.stdev([0.0, -0.25, 0.0]) / math.sqrt(3))
    assert m["independent_repair_rate"] == pytest.approx(4 / 9)
    # k = 2: task 0 pass@2(4, 1) = 1/2, task 1 pass@2(4, 2) = 5/6; repair by 1 fresh attempt
    # from the other 3: 1/3 (task 0), 2/3 (task 1), 0: (3/3 + 2 * 2/3) / 9 = 7/27
    m2 = independent_metrics(rows(), 2)
    assert m2["independent_pass"] == pytest.approx((0.5 + 5 / 6 + 0) / 3)
    assert m2["independent_repair_rate"] == pytest.approx(7 / 27)
    # a task with fewer episodes than k has no estimate: left out, counted
    few = [r for r in rows() if not (r["task_index"] == 2 and r["sample"] > 1)]
    m3 = independent_metrics(few, 3)
    assert m3["independent_excluded"] == 1 and m3["independent_pass"] == pytest.approx(1.75 / 2)
    assert independent_metrics(few[:2], 3)["independent_pass"] is None  # no task with 3 episodes
    only = independent_metrics([r for r in rows() if r["task_index"] == 1], 3)
    assert only["independent_pass"] == 1.0 and only["independent_pass_se"] is None  # one task: no SE
    with pytest.raises(ValueError, match="k must be >= 2"):
        independent_metrics(rows(), 1)
    # the summary of a multi-turn evaluation carries them for its max_turns, and shows them
    o = summarize(rows(), [1, 4], {"max_turns": 3})["overall"]
    assert o["feedback_gain"] == pytest.approx(-0.25 / 3) and o["independent_k"] == 3
    shown = dict(overall_rows(summarize(rows(), [1, 4], {"max_turns": 3})))
    assert shown["independent_repair_rate"] == "0.4444"
    # without the allowed attempts (an evaluation of unknown max_turns) there is no k
    assert "feedback_gain" not in summarize(rows(), [1, 4], {})["overall"]


def test_step_attempt_metrics_by_hand():
    def traj(vs):
        tr = Trajectory()
        for i, v in enumerate(vs):
            r = 1.0 if v == P else 0.0
            tr.turns.append(Turn(start=i, end=i + 1, reward=r, info={"verdict": v, "success": v == P}))
        return tr

    trajs = [traj(vs) for eps in TABLE.values() for vs in eps]
    m = step_attempt_metrics(trajs)
    # turn 1: 3 passes of 12; turn 2: 9 episodes reached it, 2 passed; turn 3: 7 reached, 1 passed
    assert m["rollout/reward_turn_1"] == pytest.approx(3 / 12)
    assert m["rollout/reward_turn_2"] == pytest.approx(2 / 9)
    assert m["rollout/reward_turn_3"] == pytest.approx(1 / 7)
    assert m["rollout/first_attempt_pass_rate"] == pytest.approx(3 / 12)
    assert m["rollout/repair_rate"] == pytest.approx(3 / 9)
    assert step_attempt_metrics([traj([P]), traj([F])]) == {}  # single-turn batch: nothing
    assert "rollout/repeat_rate" not in m  # the turns carry no `repeat`: no figure


def test_step_repeat_rate_by_hand():
    """`rollout/repeat_rate`: the share of attempts after the first whose `info["repeat"]` is
    true (episodes of 3, 2 and 1 attempts: 1 repeat of 3 later attempts)."""
    def traj(repeats):
        tr = Trajectory()
        for i, rep in enumerate(repeats):
            tr.turns.append(Turn(start=i, end=i + 1, reward=0.0, info={"verdict": F, "repeat": rep}))
        return tr

    m = step_attempt_metrics([traj([False, True, False]), traj([False, False]), traj([False])])
    assert m["rollout/repeat_rate"] == pytest.approx(1 / 3)
    m = step_attempt_metrics([traj([False]), traj([False]), Trajectory()])
    assert m == {}  # single-turn batch


def test_a_tool_env_has_no_attempts():
    """web_qa-like episodes: several turns (tool calls, then one answer), no verdict on any
    turn: no first-attempt or repair figure, in the summary, the training metrics or the
    per-step metrics (they would call a search a failed first attempt)."""
    tool_rows = [{**r, "turn_verdicts": [None] * r["turns"]} for r in rows()]
    o = summarize(tool_rows, [1], {"max_turns": 3})["overall"]
    assert "first_attempt_pass@1" not in o and "repair_rate" not in o and "attempts_mean" not in o
    assert "repair_rate" not in training_metrics(summarize(tool_rows, [1], {"max_turns": 3}))

    def tool_traj(n):
        tr = Trajectory()
        for i in range(n):
            tr.turns.append(Turn(start=i, end=i + 1, reward=float(i == n - 1), info={"em": 1.0}))
        return tr

    assert step_attempt_metrics([tool_traj(3), tool_traj(2)]) == {}


def test_repair_rate_se_needs_two_tasks_with_a_failed_first_attempt():
    """Task 0 fails first once and is repaired, task 1 passes first twice: the repair rate is
    1/1 from one task. The ratio estimator's residuals are then all 0 (y - R x = 1 - 1 * 1 and
    0 - 1 * 0), an SE of 0 that only says one task had a failure: no SE (None)."""
    assert ratio_se([1, 0], [1, 0]) is None
    assert ratio_se([0, 2, 0], [0, 1, 0]) is None
    one = [r for r in rows() if r["task_index"] in (0, 1) and r["sample"] < 2]  # [P], [F, P]; [P], [P]
    m = attempt_metrics(one)
    assert (m["repair_rate"], m["repair_rate_se"]) == (1.0, None)
    assert m["first_attempt_pass@1"] == pytest.approx(0.75)  # mean(1/2, 2/2)
    # two tasks with failures still get one: x = [1, 1], y = [1, 0], R = 1/2, residuals
    # +1/2, -1/2: sqrt((1/4 + 1/4) / (2 * 1)) / mean(x) = 1/2
    assert ratio_se([1, 1], [1, 0]) == pytest.approx(0.5)


def test_an_episode_without_an_attempt_is_no_failed_first_attempt():
    """A reset that failed (0 turns, `end` reset_error) counts as a failure in pass@1 and in
    first-attempt pass@1, as every unsolved episode, but it is no failed first attempt: the
    repair rate's denominator leaves it out, in evaluation and in the per-step metrics."""
    broken = {**rows()[0], "sample": 4, "success": False, "reward": 0.0, "turns": 0, "tokens": 0,
              "finish_reasons": [], "end": "reset_error", "verdict": None, "turn_verdicts": [],
              "turn_rewards": []}
    m = attempt_metrics([r for r in rows() if r["task_index"] == 0] + [broken])
    assert m["first_attempt_pass@1"] == pytest.approx(1 / 5)  # 1 of 5 episodes
    assert (m["first_attempt_failures"], m["repaired"]) == (3, 2)  # [F,P], [F,F,F], [F,P]
    assert m["repair_rate"] == pytest.approx(2 / 3)

    def traj(vs):
        tr = Trajectory()
        for i, v in enumerate(vs):
            tr.turns.append(Turn(start=i, end=i + 1, reward=float(v == P), info={"verdict": v, "success": v == P}))
        return tr

    s = step_attempt_metrics([traj(vs) for vs in TABLE[0]] + [Trajectory()])
    assert s["rollout/first_attempt_pass_rate"] == pytest.approx(1 / 5)  # as rollout/pass_rate
    assert s["rollout/repair_rate"] == pytest.approx(2 / 3)


def test_the_tables_of_a_multi_turn_evaluation_show_the_repair_metrics(tmp_path):
    """`agentrl eval`'s printed table and summary.md show what the training run's end table
    shows of a multi-turn evaluation (first-attempt pass@1 and the repair rate, each with its
    standard error, attempts per episode), and `compare` compares them; a single-turn
    evaluation shows none. Values: `TABLE` (first attempt 1/4, repair rate 1/3, 28/12 attempts)."""
    s = summarize(rows(), [1, 4], {"max_turns": 3})
    shown = dict(overall_rows(s))
    assert shown["first_attempt_pass@1"] == "0.2500"
    assert shown["first_attempt_pass@1_se"] == f"{0.25 / math.sqrt(3):.4f}"
    assert shown["repair_rate_se"] == f"{math.sqrt(26 / 54) / 3:.4f}"
    assert (shown["repair_rate"], shown["attempts_mean"]) == ("0.3333", "2.3333")
    assert (shown["first_attempt_failures"], shown["repaired"]) == ("9", "3")
    assert "| repair_rate | 0.3333 |" in summary_markdown(s)
    single = [{**r, "turns": 1, "turn_verdicts": r["turn_verdicts"][:1]} for r in rows()]
    assert "repair_rate" not in dict(overall_rows(summarize(single, [1], {})))
    a, b = tmp_path / "a", tmp_path / "b"
    write_outputs(a, rows(), s)
    better = [{**r, "success": True} if r["task_index"] == 2 and r["sample"] == 0 else r for r in rows()]
    better[8] = {**better[8], "turn_verdicts": ["fail", "pass"], "turns": 2}
    write_outputs(b, better, summarize(better, [1, 4], {"max_turns": 3}))
    d = compare(a, b)["metrics"]
    assert d["repair_rate"]["diff"] == pytest.approx(4 / 9 - 3 / 9)  # one more of 9 repaired
    assert d["first_attempt_pass@1"]["diff"] == pytest.approx(0.0)


def test_one_sample_per_task_and_episodes_cut_short_by_hand():
    """One episode per task: [P]; [F, P]; [F, F, F]; the first attempt cut by the episode's
    token cap (1 turn, verdict fail, end max_episode_tokens); an env that timed out on the
    first attempt (no verdict, reward 0, end step_timeout). The last two are failed first
    attempts that were never repaired (each the policy's or the env's fault, as in pass@1).
    first attempt: per task [1, 0, 0, 0, 0]: 1/5, se std(ddof=1) / sqrt(5) = sqrt(0.2) / sqrt(5) = 0.2.
    repair: x = [0, 1, 1, 1, 1], y = [0, 1, 0, 0, 0]: R = 1/4; residuals 0, 3/4, -1/4 x 3:
    sqrt((9/16 + 3/16) / (5 * 4)) / (4/5) = sqrt(3/80) * 5/4."""
    base = rows()[0]
    eps = [[P], [F, P], [F, F, F]]
    rs = [{**base, "task_index": i, "success": vs[-1] == P, "turns": len(vs), "turn_verdicts": vs,
           "turn_rewards": [float(v == P) for v in vs]} for i, vs in enumerate(eps)]
    rs.append({**base, "task_index": 3, "success": False, "turns": 1, "turn_verdicts": [F],
               "turn_rewards": [0.0], "end": "max_episode_tokens"})
    rs.append({**base, "task_index": 4, "success": False, "turns": 1, "turn_verdicts": [None],
               "turn_rewards": [0.0], "end": "step_timeout"})
    m = attempt_metrics(rs)
    assert m["first_attempt_pass@1"] == pytest.approx(0.2)
    assert m["first_attempt_pass@1_se"] == pytest.approx(0.2)
    assert (m["first_attempt_failures"], m["repaired"], m["repair_rate"]) == (4, 1, 0.25)
    assert m["repair_rate_se"] == pytest.approx(math.sqrt(3 / 80) * 5 / 4)
    assert m["attempts_mean"] == pytest.approx(8 / 5)


def test_the_training_log_line_says_n_a_for_an_undefined_repair_rate():
    """Every first attempt passed: the repair rate is undefined (NaN in eval/ metrics); the
    `[eval]` line says `n/a`, as the end table says `–` (it said `repair rate nan`)."""
    from agentrl.log.steps import format_eval

    nan = float("nan")
    ev = {"pass@1": 1.0, "pass@1_se": nan, "pass@2": 1.0, "pass@2_se": nan, "first_attempt_pass@1": 1.0,
          "first_attempt_pass@1_se": nan, "repair_rate": nan, "repair_rate_se": nan}
    assert format_eval(ev, 2) == "pass@1 1.000, pass@2 1.000, first attempt 1.000, repair rate n/a"
    ev.update({"repair_rate": 0.5, "repair_rate_se": 0.25, "pass@1_se": 0.1})
    assert format_eval(ev, 1) == "pass@1 1.000 ± 0.100, first attempt 1.000, repair rate 0.500 ± 0.250"
    ev.update({"repair_rate_se": None})  # `ratio_se` with one failing task (eval summaries hold None)
    assert format_eval(ev, 1) == "pass@1 1.000 ± 0.100, first attempt 1.000, repair rate 0.500"


def test_the_end_of_run_panel_sets_repair_beside_fresh_attempts(tmp_path):
    import io
    import json

    from rich.console import Console

    from agentrl.log.summary import summary_panel

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "rollout/reward_mean": 0.1}) + "\n")
    flat = training_metrics(summarize(rows(), [1, 4], {"max_turns": 3}))
    summary = {"algo": "grpo", "env": "code_sandbox", "steps": 1, "max_turns": 3, "eval_before": flat,
               "eval_after": {**flat, "feedback_gain": 0.125, "feedback_gain_se": 0.03}}
    buf = io.StringIO()
    Console(file=buf, width=200).print(summary_panel(summary, tmp_path))
    text = buf.getvalue()
    assert "pass within 3 fresh attempts" in text and f"{1.75 / 3:.3f} ± " in text
    assert "feedback gain" in text and "-0.083 ± " in text and "0.125 ± 0.030" in text
    assert "repair rate of fresh attempts" in text and "0.444" in text
