"""Evaluation reports: the summary computed from result rows, its Markdown and console tables,
and the comparison of two evaluation directories.

Everything here is a pure function of the rows of `results.jsonl` (one dict per episode, see
`agentrl.eval.harness.episode_row`), so a summary can always be recomputed from the results
file (`summarize(read_results(dir), k_list)`). No torch import.

Metric definitions (overall and per task):
- `pass@k`: per task, the unbiased estimator `pass_at_k(n, c, k)` with n episodes and c
  successes; overall, the mean over tasks with n >= k (`excluded@k` counts the others, case
  E5; the value is None when every task is excluded). `pass@k_se`: its standard error over
  tasks, `std(per-task pass@k, ddof=1) / sqrt(tasks)` (the spread a different draw of tasks of
  the same family would give; None with fewer than two tasks).
- `success_rate`: successes / episodes (= pass@1 when every task has the same n).
- `reward_mean`, `reward_std`: mean and population std (ddof = 0) of the episode's extrinsic
  reward (`agentrl.eval.episodes.extrinsic_return`) over episodes whose reward is a number; episodes
  with a NaN reward are counted in `nan_rewards`.
- `turns_mean`: agent turns per episode; `tokens_mean`: sampled (generated) tokens per episode;
  `total_tokens_mean`: all tokens of the episode (prompt and observations included).
- `finish_reasons`: sampler finish reason of every turn ("stop" | "length"), counted over turns.
- `end_reasons`: how each episode ended: "terminated" (the task ended, even if a limit was
  reached on the same step), "truncated" (turn limit), "max_episode_tokens", "env_error" (the
  env raised in step), "reset_error", "step_timeout" or "reset_timeout" (a call past
  `env.step_timeout_s` / `env.reset_timeout_s`); with `--agent`, "agent_error" (the user's agent
  raised, returned no reward, was refused or never called) and "agent_timeout".
- `verdicts`: the last turn's `info["verdict"]` (sandbox verdict) counted over episodes that have one.
- multi-attempt evaluations only (an env that grades its turns, a verdict per turn, and
  `meta["max_turns"]` > 1 or an episode of more than one turn; not a tool env's steps):
  `first_attempt_pass@1` (± `_se`), `repair_rate` (± `_se`), `attempts_mean`,
  `first_attempt_failures`, `repaired` (`agentrl.eval.attempts`), and with `meta["max_turns"]`
  = k > 1 the same k attempts made without feedback (`independent_metrics`: `independent_k`,
  `independent_pass` ± `_se`, `feedback_gain` ± `_se`, `independent_repair_rate`,
  `independent_excluded`), shown in the overall table after pass@k (`REPAIR_ROWS`); `pass@k`
  is then pass within the allowed attempts.
- `errors`: episodes with at least one recorded error message (`agentrl.types.episode_errors`:
  env exceptions, tool-call errors, envs that explain a failed attempt, e.g. code_sandbox's
  failing assertion, a failed reset, the user's agent's failure), what training's `env/errors`
  counts too; `env_errors`: episodes the env broke (`end` is env_error, reset_error,
  step_timeout, reset_timeout, agent_error or agent_timeout).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.eval.attempts import attempt_metrics, independent_metrics, is_multi_attempt
from agentrl.eval.metrics import mean_se, pass_at_k_many

ENV_ERROR_ENDS = ("env_error", "reset_error", "step_timeout", "reset_timeout", "agent_error", "agent_timeout")
"""Episode endings (`end`) where the env broke, counted in `env_errors`."""

# Numeric overall metrics shown in tables and compared by `compare` (pass@k keys are added).
_NUMERIC = ("success_rate", "reward_mean", "reward_std", "turns_mean", "tokens_mean",
            "total_tokens_mean", "errors", "env_errors", "nan_rewards", "episodes", "tasks")
REPAIR_ROWS = ("first_attempt_pass@1", "first_attempt_pass@1_se", "repair_rate", "repair_rate_se",
               "attempts_mean", "first_attempt_failures", "repaired", "independent_k", "independent_pass",
               "independent_pass_se", "feedback_gain", "feedback_gain_se", "independent_repair_rate",
               "independent_excluded")
"""The repair metrics of a multi-attempt evaluation (`agentrl.eval.attempts`), shown in its
tables (after pass@k, as the training run's end table shows them) and compared by `compare`
when both evaluations have them."""


def read_results(out_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of `out_dir/results.jsonl` (one dict per episode, file order).

    Raises:
        FileNotFoundError: no results file.
    """
    path = Path(out_dir) / "results.jsonl"
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def _episode_stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Statistics shared by the overall and the per-task summaries (see module doc)."""
    rewards = [float(r["reward"]) for r in rows if r.get("reward") is not None]
    finish = Counter(f for r in rows for f in r.get("finish_reasons", []))
    verdicts = Counter(str(r["verdict"]) for r in rows if r.get("verdict") is not None)
    return {
        "episodes": len(rows),
        "successes": int(sum(bool(r["success"]) for r in rows)),
        "success_rate": _mean([float(bool(r["success"])) for r in rows]),
        "reward_mean": _mean(rewards),
        "reward_std": float(np.std(rewards)) if rewards else None,
        "nan_rewards": len(rows) - len(rewards),
        "turns_mean": _mean([r["turns"] for r in rows]),
        "tokens_mean": _mean([r["tokens"] for r in rows]),
        "total_tokens_mean": _mean([r["total_tokens"] for r in rows]),
        "finish_reasons": dict(sorted(finish.items())),
        "end_reasons": dict(sorted(Counter(r["end"] for r in rows).items())),
        "verdicts": dict(sorted(verdicts.items())),
        "errors": int(sum(bool(r.get("errors")) for r in rows)),
        "env_errors": int(sum(r["end"] in ENV_ERROR_ENDS for r in rows)),
    }


def group_by_task(rows: Iterable[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Rows grouped by `task_index`, in ascending task order."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(int(r["task_index"]), []).append(r)
    return dict(sorted(groups.items()))


def summarize(rows: Sequence[dict[str, Any]], k_list: Sequence[int],
              meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary of an evaluation from its result rows.

    Args:
        rows: one dict per episode with at least `task_index`, `task_id`, `success`, `reward`
            (float or None for NaN), `turns`, `tokens`, `total_tokens`, `finish_reasons`
            (list), `end`, `verdict` (or None), `errors` (list).
        k_list: the k values of pass@k.
        meta: copied into `summary["meta"]` (run settings).

    Returns:
        `{"meta", "k", "overall", "tasks"}`: `overall` holds `tasks` (count), the episode
        statistics (module doc), `pass@k` for each k (None if every task has fewer than k
        episodes), `excluded@k` (tasks with n < k) and `error_examples` (up to 5 distinct error
        messages); `tasks` is a list, by task index, of `{task_index, task_id, n, c, pass@k...,
        <episode statistics>}` where `pass@k` is None when n < k.
    """
    ks = sorted({int(k) for k in k_list})
    groups = group_by_task(rows)
    tasks = []
    for idx, g in groups.items():
        n, c = len(g), int(sum(bool(r["success"]) for r in g))
        t: dict[str, Any] = {"task_index": idx, "task_id": g[0]["task_id"], "n": n, "c": c}
        for k in ks:
            vals, _ = pass_at_k_many([n], [c], k)
            t[f"pass@{k}"] = float(vals[0]) if vals.size else None
        t.update(_episode_stats(g))
        tasks.append(t)
    overall: dict[str, Any] = {"tasks": len(groups)}
    for k in ks:
        vals, excluded = pass_at_k_many([t["n"] for t in tasks], [t["c"] for t in tasks], k)
        overall[f"pass@{k}"], overall[f"pass@{k}_se"] = mean_se(vals)
        overall[f"excluded@{k}"] = excluded
    overall.update(_episode_stats(rows))
    if is_multi_attempt(rows, (meta or {}).get("max_turns")):
        overall.update(attempt_metrics(rows))
        if int((meta or {}).get("max_turns") or 0) > 1:  # against as many attempts without feedback
            overall.update(independent_metrics(rows, int(meta["max_turns"])))
    examples = list(dict.fromkeys(e for r in rows for e in r.get("errors", [])))
    overall["error_examples"] = examples[:5]
    return {"meta": dict(meta or {}), "k": ks, "overall": overall, "tasks": tasks}


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

def _fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4f}"
    if isinstance(x, dict):
        return ", ".join(f"{k}: {v}" for k, v in x.items()) or "-"
    return str(x)


def overall_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(metric, formatted value) pairs of the overall summary, in display order."""
    o = summary["overall"]
    keys = [m for k in summary["k"] for m in (f"pass@{k}", f"pass@{k}_se")]
    keys += [k for k in REPAIR_ROWS if k in o]  # multi-attempt evaluations only
    keys += [k for k in ("tasks", "episodes", "success_rate", "reward_mean", "reward_std",
                         "turns_mean", "tokens_mean", "total_tokens_mean", "finish_reasons",
                         "end_reasons", "verdicts", "errors", "env_errors", "nan_rewards")]
    out = [(k, _fmt(o.get(k))) for k in keys]
    out += [(f"excluded@{k}", str(o[f"excluded@{k}"])) for k in summary["k"] if o.get(f"excluded@{k}")]
    return out


TASK_HEADERS = {"reward_mean": "reward", "turns_mean": "turns", "tokens_mean": "tokens"}
"""Short headers of the printed per-task table (summary.md keeps the full names)."""


def _short(x: Any) -> str:
    """A per-task cell: numbers to 3 significant digits (`0.25`, `1`, `96`), the rest as `_fmt`."""
    if isinstance(x, float) and not math.isnan(x):
        return f"{x:.3g}"
    return _fmt(x)


def _task_columns(summary: dict[str, Any]) -> list[str]:
    return (["task_id", "n", "c"] + [f"pass@{k}" for k in summary["k"]]
            + ["reward_mean", "turns_mean", "tokens_mean", "verdicts", "errors"])


def summary_markdown(summary: dict[str, Any]) -> str:
    """`summary.md`: run settings, the overall table and the per-task table (Markdown)."""
    meta = summary.get("meta", {})
    lines = ["# Evaluation", ""]
    if meta:
        lines += [", ".join(f"{k}: `{v}`" for k, v in meta.items() if v is not None), ""]
    lines += ["## Overall", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in overall_rows(summary)]
    if summary["overall"].get("error_examples"):
        lines += ["", "Errors (first distinct messages):", ""]
        lines += [f"- `{e}`" for e in summary["overall"]["error_examples"]]
    cols = _task_columns(summary)
    lines += ["", "## Per task", "", "| " + " | ".join(cols) + " |",
              "| " + " | ".join("---" for _ in cols) + " |"]
    for t in summary["tasks"]:
        lines.append("| " + " | ".join(_fmt(t.get(c)).replace("|", "\\|") for c in cols) + " |")
    return "\n".join(lines) + "\n"


def print_summary(summary: dict[str, Any], console: Any = None, *, max_task_rows: int = 30) -> None:
    """Print the overall table (and the per-task table when there are at most `max_task_rows`
    tasks) with rich."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="evaluation", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in overall_rows(summary):
        table.add_row(k, v)
    console.print(table)
    if 0 < len(summary["tasks"]) <= max_task_rows:
        from rich import box

        cols = _task_columns(summary)
        # short headers and 3 significant digits, numbers never wrapped or cut: readable at 80
        # columns and in a log file (only the verdicts column wraps)
        per = Table(title="per task", show_header=True, box=box.SIMPLE, pad_edge=False)
        for c in cols:
            per.add_column(TASK_HEADERS.get(c, c), justify="left" if c in ("task_id", "verdicts") else "right",
                           no_wrap=c != "verdicts", min_width=len(TASK_HEADERS.get(c, c)))
        for t in summary["tasks"]:
            per.add_row(*[_short(t.get(c)) for c in cols])
        console.print(per)


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------

def _inner_evals(d: str | Path) -> list[str]:
    """The evaluation folders inside `d` when it is a training run's folder (`d/eval/before`,
    `d/eval/after`) or its `eval` folder (`d/before`, `d/after`): those with a summary.json."""
    d = Path(d)
    return [str(p) for p in (d / "eval" / "before", d / "eval" / "after", d / "before", d / "after")
            if (p / "summary.json").is_file()]


def _load_summary(d: str | Path) -> dict[str, Any]:
    path = Path(d) / "summary.json"
    inner = _inner_evals(d)
    hint = (f"its held-out evaluations are {' and '.join(inner)}: compare those, e.g. "
            f"`agentrl eval --compare {inner[0]} {inner[-1]}`") if inner else ""
    if not path.exists():
        raise FileNotFoundError(f"compare: {path} not found ("
                                + (hint or f"run `agentrl eval --out {d}` first") + ")")
    try:
        data = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise ValueError(f"compare: cannot read {path}: {e}") from None
    if not (isinstance(data, dict) and isinstance(data.get("k"), list)
            and isinstance(data.get("overall"), dict) and isinstance(data.get("tasks"), list)):
        raise ValueError(f"compare: {d} is not an evaluation folder (its summary.json has no "
                         "pass@k results; a training run's folder?). "
                         + (hint[0].upper() + hint[1:] if hint else
                            f"Evaluate it first: `agentrl eval --model {d} --out EVAL_DIR`, then compare the EVAL_DIRs"))
    return data


def _diff(a: Any, b: Any) -> float | int | None:
    """b - a: an int for two counts (episodes, errors, ...), a float otherwise, None when
    either is missing or not a number."""
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b)):
        return None
    if isinstance(a, int) and isinstance(b, int):
        return b - a
    return float(b) - float(a)


def _fmt_diff(d: float | int | None) -> str:
    """A difference as the table shows it: `+3` for counts, `+0.0417` otherwise, `n/a`."""
    if d is None:
        return "n/a"
    return f"{d:+d}" if isinstance(d, int) else f"{d:+.4f}"


def compare(dir_a: str | Path, dir_b: str | Path) -> dict[str, Any]:
    """Compare two evaluation directories (their `summary.json`), B relative to A.

    Tasks are matched by `task_id`. A task is *solved* when at least one of its episodes
    succeeded (c > 0).

    Returns:
        `{"a", "b", "metrics", "tasks", "flipped", "only_a", "only_b"}`:
        `metrics[name] = {"a", "b", "diff"}` for every overall number (pass@k of the k's both
        runs have, the repair metrics `REPAIR_ROWS` both have, success rate, reward, turns, tokens, errors, ...; `diff = b - a`, None when
        either side is None); `tasks` is a list of `{"task_id", "<metric>": {"a", "b", "diff"}}`
        over the common tasks for pass@k, success_rate and reward_mean; `flipped` is
        `{"gained": [task ids solved in B, not in A], "lost": [solved in A, not in B]}`;
        `only_a` / `only_b` list task ids present in one run only.

    Raises:
        FileNotFoundError: a directory has no summary.json.
        ValueError: a summary.json that is not an evaluation's (e.g. a training run folder).
    """
    sa, sb = _load_summary(dir_a), _load_summary(dir_b)
    ks = [k for k in sa["k"] if k in sb["k"]]
    names = [f"pass@{k}" for k in ks] + [m for m in REPAIR_ROWS if m in sa["overall"] and m in sb["overall"]]
    names += list(_NUMERIC)
    metrics = {m: {"a": sa["overall"].get(m), "b": sb["overall"].get(m),
                   "diff": _diff(sa["overall"].get(m), sb["overall"].get(m))} for m in names}
    ta = {t["task_id"]: t for t in sa["tasks"]}
    tb = {t["task_id"]: t for t in sb["tasks"]}
    per_task, gained, lost = [], [], []
    for tid in [t for t in ta if t in tb]:
        a, b = ta[tid], tb[tid]
        row: dict[str, Any] = {"task_id": tid}
        for m in [f"pass@{k}" for k in ks] + ["success_rate", "reward_mean"]:
            row[m] = {"a": a.get(m), "b": b.get(m), "diff": _diff(a.get(m), b.get(m))}
        per_task.append(row)
        if a["c"] == 0 and b["c"] > 0:
            gained.append(tid)
        elif a["c"] > 0 and b["c"] == 0:
            lost.append(tid)
    return {"a": str(dir_a), "b": str(dir_b), "metrics": metrics, "tasks": per_task,
            "flipped": {"gained": gained, "lost": lost},
            "only_a": [t for t in ta if t not in tb], "only_b": [t for t in tb if t not in ta]}


def print_compare(result: dict[str, Any], console: Any = None, *, max_task_rows: int = 30) -> None:
    """Print `compare`'s result: the metric table, the tasks whose pass@1 (or first pass@k)
    changed (at most `max_task_rows`), and the flipped tasks."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"B = {result['b']}  vs  A = {result['a']}")
    for c in ("metric", "A", "B", "B - A"):
        table.add_column(c, justify="left" if c == "metric" else "right")
    for m, v in result["metrics"].items():
        d = v["diff"]
        table.add_row(m, _fmt(v["a"]), _fmt(v["b"]), _fmt_diff(d))
    console.print(table)
    key = next((m for m in (result["tasks"][0] if result["tasks"] else {}) if m.startswith("pass@")), None)
    changed = [t for t in result["tasks"] if key and t[key]["diff"]]
    if changed:
        per = Table(title=f"tasks whose {key} changed ({len(changed)})")
        for c in ("task_id", "A", "B", "B - A"):
            per.add_column(c, justify="left" if c == "task_id" else "right")
        for t in changed[:max_task_rows]:
            per.add_row(str(t["task_id"]), _fmt(t[key]["a"]), _fmt(t[key]["b"]), _fmt_diff(t[key]["diff"]))
        console.print(per)
    f = result["flipped"]
    console.print(f"solved in B only (gained, {len(f['gained'])}): {', '.join(map(str, f['gained'])) or '-'}",
                  markup=False, highlight=False)
    console.print(f"solved in A only (lost, {len(f['lost'])}): {', '.join(map(str, f['lost'])) or '-'}",
                  markup=False, highlight=False)
    if result["only_a"] or result["only_b"]:
        console.print(f"tasks only in A: {len(result['only_a'])}, only in B: {len(result['only_b'])}",
                      markup=False, highlight=False)
