"""Does the feedback help? Multi-turn repair against as many fresh attempts (issue 40).

    python benchmarks/repair_vs_fresh.py RUN [RUN ...] [--tag TAG] [--trained-on COMMIT]

For each finished multi-turn training run RUN (a `configs/code_repair.yaml` run: RUN/config.json,
RUN/eval/before and RUN/eval/after, each with results.jsonl), its held-out evaluations before and
after RL are summarised again from their episodes with the library's `agentrl.eval.report.
summarize` (k = the run's `env.max_turns`), which sets pass within k attempts *with* feedback
beside k independent first attempts (`agentrl.eval.attempts.independent_metrics`: Chen et al.'s
unbiased pass@k of each task's first attempts; the equal-attempts comparison of Olausson et al.,
ICLR 2024, "Is Self-Repair a Silver Bullet for Code Generation?"), and adds, from the same
episodes, the second attempt's pass rate after a failed first against one fresh attempt's
(pass@1 of the task's other first attempts). The recomputed pass within k and repair rate must
equal the run's own summary.json (same episodes; the script exits otherwise).

Writes benchmarks/results/repair_vs_fresh[_TAG].json (this commit, the command, `--trained-on`:
the commit that trained the runs, and per run and evaluation every figure) and .md (the table),
and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from overhead_common import provenance  # noqa: E402

from agentrl.eval.attempts import first_attempt_passed  # noqa: E402
from agentrl.eval.report import group_by_task, read_results, summarize  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = ("first_attempt_pass@1", "first_attempt_pass@1_se", "pass@1", "pass@1_se", "independent_k",
        "independent_pass", "independent_pass_se", "feedback_gain", "feedback_gain_se", "repair_rate",
        "repair_rate_se", "independent_repair_rate", "independent_excluded", "first_attempt_failures",
        "repaired")


def second_attempt(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Of the failed first attempts with a second attempt: the share whose second attempt
    passed (`second_attempt_pass`), against the pass rate of one fresh first attempt at the
    same tasks (`one_fresh_attempt`: per failed episode of task i, c_i / (n_i - 1), the pass
    rate of the task's other first attempts), pooled over those episodes; None without one;
    and how many of those second attempts repeated the first word for word (`repeats`)."""
    got, fresh, n, same = 0, 0.0, 0, 0
    for g in group_by_task(rows).values():
        firsts = [first_attempt_passed(r.get("turn_verdicts") or [], r.get("turn_rewards") or []) for r in g]
        c = sum(firsts)
        for r, f in zip(g, firsts):
            v = r.get("turn_verdicts") or []
            if f or len(v) < 2 or len(g) < 2:
                continue
            n += 1
            got += v[1] == "pass"
            said = [m["content"] for m in r.get("messages") or [] if m.get("role") == "assistant"]
            same += len(said) > 1 and said[-len(v)] == said[-len(v) + 1]
            fresh += c / (len(g) - 1)
    return {"second_attempt_pass": got / n if n else None, "one_fresh_attempt": fresh / n if n else None,
            "second_attempts": n, "repeats": same}


def run_figures(run: Path) -> dict[str, Any]:
    """The figures of RUN's evaluations before and after RL (module doc). Raises SystemExit
    when a recomputed pass@1 or repair rate differs from RUN/summary.json's."""
    cfg = json.loads((run / "config.json").read_text())
    k = int(cfg["env"]["max_turns"] or 1)
    if k < 2:
        raise SystemExit(f"{run}: env.max_turns is {cfg['env']['max_turns']}: not a multi-turn run")
    own = json.loads((run / "summary.json").read_text())
    out: dict[str, Any] = {"max_turns": k, "seed": cfg.get("seed"), "turn_credit": cfg["algo"].get("turn_credit"),
                           "branch": cfg["rollout"].get("branch")}
    for when in ("before", "after"):
        rows = read_results(run / "eval" / when)
        o = summarize(rows, [1], {"max_turns": k})["overall"]
        for key in ("pass@1", "repair_rate"):
            if abs(o[key] - own[f"eval_{when}"][key]) > 1e-12:
                raise SystemExit(f"{run}/eval/{when}: {key} {o[key]} recomputed, {own[f'eval_{when}'][key]} "
                                 "in the run's summary.json: not the run's episodes")
        out[when] = {**{key: o.get(key) for key in KEYS}, **second_attempt(rows)}
    return out


def _f(x: Any, se: Any = None) -> str:
    if x is None:
        return "–"
    return f"{x:+.3f}" if se == "sign" else f"{x:.3f}" + (f" ± {se:.3f}" if isinstance(se, float) else "")


def table(runs: dict[str, dict[str, Any]]) -> str:
    """The Markdown table: one row per run and evaluation."""
    head = ("| run | eval | first attempt | pass within k, feedback | pass within k, fresh | feedback gain | "
            "repair rate, feedback | repair rate, fresh | 2nd attempt after a failure | one fresh attempt | "
            "2nd attempt repeats the 1st |")
    lines = [head, "|" + " --- |" * 11]
    for name, r in runs.items():
        for when in ("before", "after"):
            x = r[when]
            lines.append(
                f"| {name} | {when} RL | {_f(x['first_attempt_pass@1'], x['first_attempt_pass@1_se'])} | "
                f"{_f(x['pass@1'], x['pass@1_se'])} | {_f(x['independent_pass'], x['independent_pass_se'])} | "
                f"{_f(x['feedback_gain'], 'sign')} ± {_f(x['feedback_gain_se'])} | "
                f"{_f(x['repair_rate'], x['repair_rate_se'])} | {_f(x['independent_repair_rate'])} | "
                f"{_f(x['second_attempt_pass'])} | {_f(x['one_fresh_attempt'])} | "
                f"{_f(x['repeats'] / x['second_attempts'] if x['second_attempts'] else None)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="finished multi-turn training run folders")
    p.add_argument("--tag", default="")
    p.add_argument("--trained-on", default=None, help="the commit that trained the runs (recorded)")
    p.add_argument("--results", default=str(RESULTS), help="where to write the .json and .md")
    a = p.parse_args(argv)
    names = [Path(r).resolve().parent.name.removeprefix("code_repair_") + "/" + Path(r).name for r in a.runs]
    if len(set(names)) < len(names):
        p.error("two runs of the same folder and parent name")
    runs = {n: run_figures(Path(r)) for n, r in zip(names, a.runs)}
    record = {**provenance(), "trained_on": a.trained_on, "runs": {n: {"path": str(Path(r).resolve()), **runs[n]}
                                                                   for n, r in zip(runs, a.runs)}}
    name = "repair_vs_fresh" + (f"_{a.tag}" if a.tag else "")
    out = Path(a.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    md = table(runs)
    (out / f"{name}.md").write_text(f"`{record['command']}` on {record['commit']} (runs trained on "
                                    f"{a.trained_on or 'an unrecorded commit'})\n\n{md}\n")
    print(md)
    return record


if __name__ == "__main__":
    main()
