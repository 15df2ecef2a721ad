"""The one-screen summary printed at the end of `agentrl train`, and readers of a run's
OUT/metrics.jsonl shared by the summary, `agentrl plot` and tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STAGES = ("sft", "rollout", "update", "sync", "eval")
"""The stages the summary shows, in order (other `perf/*_s` keys stay in metrics.jsonl)."""


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl file (a torn or malformed line is skipped; a missing file gives
    no rows). Each row has `step` and namespaced keys (`rollout/...`, `perf/...`, `eval/...`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def stage_seconds(metrics_path: str | Path) -> dict[str, float]:
    """Total seconds per stage over a run: `perf/<stage>_s` summed over steps (`rollout`,
    `update`, `sync`, `env` (part of rollout), `step` = rollout + update + sync), `loop` (the
    last `perf/loop_s`: it is already a running total, wall seconds since the loop started,
    so it is never summed), and `eval` = `eval/seconds` summed over the rows that hold one:
    each held-out evaluation is logged once (before RL at step 0, every `train.eval_every`
    steps, the final one at the last step), so each is counted once."""
    totals: dict[str, float] = {}
    for row in read_metrics(metrics_path):
        if isinstance(row.get("perf/loop_s"), (int, float)):
            totals["loop"] = float(row["perf/loop_s"])
        for k, v in row.items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if k == "perf/loop_s":
                continue
            if k.startswith("perf/") and k.endswith("_s"):
                name = k[len("perf/"):-2]
            elif k == "eval/seconds":
                name = "eval"
            else:
                continue
            totals[name] = totals.get(name, 0.0) + float(v)
    return totals


PROFILE = (("generation", "generate"), ("env/tool/sandbox", "env"), ("reward model", "reward_model"),
           ("reference", "reference"), ("reference worker busy", "reference_busy"),
           ("teacher worker busy", "teacher_busy"),
           ("old logprobs + values", "prepare"), ("policy update", "policy_update"), ("weight sync", "sync"),
           ("learner idle", "learner_idle"), ("rollout idle", "rollout_idle"),
           ("reference worker idle", "reference_idle"), ("teacher worker idle", "teacher_idle"),
           ("reward model worker idle", "reward_model_idle"))
"""The cost profile's stages: (label, `perf/<key>_s`). generation and env are wall seconds of
the rollout's generate calls and env steps (the env's includes an inline reward model, which
scores inside env steps); reward model is the model's busy seconds wherever it runs; reference
is the seconds the loop spent on reference logprobs (computing them inline, or waiting for the
worker); old logprobs + values is the learner's no-grad pass of the algorithm's `prepare` (PPO's
values; distill's, with the inline teacher's forward or the wait for its worker); policy update is
the learner's update (PPO's value head shares its forward, backward and optimizer step, so the
value update is inside it); the idle rows are the seconds each worker waited in the steps."""


def cost_profile(stages: dict[str, float]) -> list[tuple[str, float, float]]:
    """(label, seconds, share of the run's step seconds) for each `PROFILE` stage that was
    logged, from `stage_seconds`' totals. Stages on other workers or threads overlap the
    learner's (async mode, workers), so the shares may add up past 1."""
    total = stages.get("step", 0.0)
    return [(label, stages[key], stages[key] / total if total > 0 else float("nan"))
            for label, key in PROFILE if key in stages]


def format_profile(stages: dict[str, float]) -> str:
    """`cost profile (s, share of step time): generation 12.1s 35% · ...` ("" when no stage
    was logged)."""
    rows = cost_profile(stages)
    if not rows:
        return ""
    return ("cost profile (s, share of step time; stages of other workers overlap): "
            + " · ".join(f"{label} {sec:.1f}s {share:.0%}" for label, sec, share in rows))


def _first_last(rows: list[dict[str, Any]], key: str) -> tuple[float | None, float | None]:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return (vals[0], vals[-1]) if vals else (None, None)


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or x != x else f"{x:.{digits}f}"


def _with_se(ev: dict[str, Any], key: str) -> str:
    """`0.316 ± 0.020` (`key` and `key_se` of an evaluation), `–` when missing."""
    v, se = ev.get(key), ev.get(f"{key}_se")
    if not isinstance(v, (int, float)) or v != v:
        return "–"
    return f"{v:.3f}" + (f" ± {se:.3f}" if isinstance(se, (int, float)) and se == se else "")


def reward_repeats_pass1(*evals: dict[str, Any]) -> bool:
    """Whether every evaluation's `reward_mean` equals its `pass@1` (code_sandbox's reward is
    1 for a solved task, 0 otherwise): the summary then shows pass@1 alone."""
    pairs = [(e.get("reward_mean"), e.get("pass@1")) for e in evals if e]
    return bool(pairs) and all(isinstance(r, (int, float)) and isinstance(p, (int, float))
                               and abs(r - p) < 1e-9 for r, p in pairs)


def summary_panel(summary: dict[str, Any], out: str | Path) -> Any:
    """A rich renderable of a finished run: held-out pass@1 and pass@k before/after RL with ±
    one standard error over tasks (a multi-turn run adds first-attempt pass@1, pass within
    `max_turns` attempts, the repair rate and attempts per episode, and against as many fresh
    attempts without feedback: their pass rate, the feedback gain, their repair rate), the held-out reward (only when it is not the same number as
    pass@1), the training reward and pass rate of the first and last step, seconds per stage
    (`summary["stage_seconds"]`: each evaluation counted once), and where the checkpoint,
    metrics and TensorBoard files are."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    out = Path(out)
    before, after = summary.get("eval_before") or {}, summary.get("eval_after") or {}
    rows = read_metrics(out / "metrics.jsonl")
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("before RL", justify="right")
    table.add_column("after RL", justify="right")
    ks = sorted({int(k.split("@")[1]) for k in {**before, **after} if k.startswith("pass@")
                 and not k.endswith("_se") and k.split("@")[1].isdigit()})
    for k in ks or [1]:
        table.add_row(f"held-out pass@{k} ± s.e.", _with_se(before, f"pass@{k}"), _with_se(after, f"pass@{k}"))
    if "repair_rate" in before or "repair_rate" in after:  # a multi-turn run (agentrl.eval.attempts)
        n = summary.get("max_turns") or "N"
        table.add_row("  first-attempt pass@1", _with_se(before, "first_attempt_pass@1"),
                      _with_se(after, "first_attempt_pass@1"))
        table.add_row(f"  pass within {n} attempts", _with_se(before, "pass@1"), _with_se(after, "pass@1"))
        table.add_row("  repair rate", _with_se(before, "repair_rate"), _with_se(after, "repair_rate"))
        if "feedback_gain" in before or "feedback_gain" in after:  # against attempts without feedback
            table.add_row(f"  pass within {n} fresh attempts", _with_se(before, "independent_pass"),
                          _with_se(after, "independent_pass"))
            table.add_row("  feedback gain", _with_se(before, "feedback_gain"), _with_se(after, "feedback_gain"))
            table.add_row("  repair rate of fresh attempts", _fmt(before.get("independent_repair_rate")),
                          _fmt(after.get("independent_repair_rate")))
        table.add_row("  attempts per episode", _fmt(before.get("attempts_mean"), 2),
                      _fmt(after.get("attempts_mean"), 2))
    if not (summary.get("heldout_reward_is_pass@1") or reward_repeats_pass1(before, after)):
        table.add_row("held-out reward", _fmt(before.get("reward_mean")), _fmt(after.get("reward_mean")))
    table.add_row("", "first step", "last step")
    r0, r1 = _first_last(rows, "rollout/reward_mean")
    p0, p1 = _first_last(rows, "rollout/pass_rate")
    table.add_row("train reward", _fmt(r0), _fmt(r1))
    if (r0, r1) != (p0, p1):
        table.add_row("train pass rate", _fmt(p0), _fmt(p1))
    stages = dict(summary.get("stage_seconds") or stage_seconds(out / "metrics.jsonl"))
    env_s = stages.get("env")  # env time is part of rollout time
    shown = [f"{k} {stages[k]:.1f}s" + (f" (env {env_s:.1f}s)" if k == "rollout" and env_s is not None else "")
             for k in STAGES if k in stages]
    profile = format_profile(stages)
    lines = [
        "time per stage: " + (" · ".join(shown) if shown else "–"),
        *([profile] if profile else []),
        f"checkpoint: {summary.get('checkpoint', '–')}",
        f"metrics: {out / 'metrics.jsonl'}"
        + (f" · TensorBoard: {out / 'tb'}" if (out / "tb").is_dir() else ""),
        f"next: agentrl plot {out} (open {out / 'plots' / 'dashboard.png'}) · agentrl show {out}",
    ]
    title = f"{summary.get('algo', '')} on {summary.get('env', '')}, {summary.get('steps', '?')} steps"
    return Panel(Group(table, Text(""), *(Text(line) for line in lines)), title=title, expand=False)
