"""The sandbox's verdict cache on the main job's recorded answers: wall time of one batch's env
steps with every answer run, with the cache, and with the cache and the agent loop's
round-robin submission (`agentrl.rollout.spread`), and a check that the cache changes no step.

Replays recorded training steps (a run's `rollouts/step_N.jsonl`, e.g. the default main job's,
written every `train.log_rollouts_every` steps): each episode's task is rebuilt from its id
(built-in tasks), a fresh `code_sandbox` env steps the recorded answer, on one `SandboxPool` of
`--workers` workers (default: one per core, as the env's default pool) through a thread pool
of `--threads` (the run's `rollout.env_threads`, 4), as `agent_loop.step_all` does. Each arm
empties the cache first and runs `--repeats` times (the least wall time is kept); the arms
alternate within a repeat, so load hits them alike. Every answer's (reward, verdict, passed,
feedback) must be equal with and without the cache, or the script exits 1.

    python benchmarks/verdict_cache.py --rollouts RUN/rollouts --steps 5 125 245

Writes benchmarks/results/verdict_cache.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from overhead_common import provenance  # noqa: E402  (commit, dirty tree, command, load)

ARMS = ("every answer run", "cache", "cache + spread")


def task_from_id(task_id: str) -> Any:
    """The built-in task `gen/<template>/<params>/<args>/<name>` (`code_tasks.make_task`), or
    None for an id of another form or one no template matches."""
    from agentrl_envs import code_tasks

    parts = task_id.split("/")
    if len(parts) != 5 or parts[0] != "gen":
        return None
    _, tid, ps, args, name = parts
    for tpl in code_tasks.TEMPLATES:
        if tpl.tid != tid:
            continue
        for params in tpl.param_grid():
            if ",".join(f"{k}={params[k]}" for k in sorted(params)) != ps:
                continue
            for argset in code_tasks.ARG_NAMES[tpl.kind]:
                if argset.replace(", ", ",") == args:
                    return code_tasks.make_task(tpl, params, argset, name)
    return None


def load_step(path: Path) -> tuple[list[Any], list[str], list[int], int]:
    """(tasks, first answers, group ids, rows skipped) of one recorded step's built-in episodes."""
    tasks, answers, groups, skipped = [], [], [], 0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        task = task_from_id(row["task_id"])
        if task is None or not row["turns"]:
            skipped += 1
            continue
        tasks.append(task)
        answers.append(row["turns"][0]["text"])
        groups.append(row["group_id"])
    return tasks, answers, groups, skipped


def step_batch(pool: Any, threads: ThreadPoolExecutor, tasks: list[Any], answers: list[str],
               groups: list[int], cache: bool, spread: bool) -> tuple[float, list[tuple]]:
    """Wall seconds of stepping one fresh env per answer (reset onto its task), and each step's
    (reward, verdict, passed, feedback), in the batch's order."""
    from agentrl.rollout.spread import map_spread
    from agentrl_envs.code_sandbox import CodeSandboxEnv

    pool._cache.clear()
    envs = []
    for task in tasks:
        env = CodeSandboxEnv(pool=pool, cache_verdicts=cache)
        env.reset(options={"task": {"task_id": task.task_id, "entry_point": task.entry_point,
                                    "prompt": task.prompt, "tests": list(task.tests)}})
        envs.append(env)
    order_groups = groups if spread else list(range(len(tasks)))  # distinct groups: as given
    t0 = time.perf_counter()
    out = map_spread(threads, lambda e, a: e.step(a), envs, answers, order_groups)
    wall = time.perf_counter() - t0
    return wall, [(r, info["verdict"], info["passed"], json.dumps(obs)) for obs, r, _, _, info in out]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", required=True, help="a run's rollouts/ folder")
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 125, 245])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="sandbox workers")
    ap.add_argument("--threads", type=int, default=4, help="env threads (rollout.env_threads)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "verdict_cache.json"))
    ap.add_argument("--md", default=str(ROOT / "benchmarks" / "results" / "verdict_cache.md"))
    a = ap.parse_args(argv)
    from agentrl.sandbox import SandboxPool

    rows, same = [], True
    with SandboxPool(workers=a.workers, backend="auto") as pool, ThreadPoolExecutor(a.threads) as threads:
        for step in a.steps:
            tasks, answers, groups, skipped = load_step(Path(a.rollouts) / f"step_{step}.jsonl")
            arms = {"every answer run": (False, False), "cache": (True, False), "cache + spread": (True, True)}
            step_batch(pool, threads, tasks, answers, groups, False, False)  # warm the sandbox
            walls: dict[str, list[float]] = {k: [] for k in arms}
            equal = True
            for _ in range(a.repeats):  # every repeat's steps are compared, not the last one's only
                results: dict[str, list[tuple]] = {}
                for arm, (cache, spread) in arms.items():
                    wall, res = step_batch(pool, threads, tasks, answers, groups, cache, spread)
                    walls[arm].append(wall)
                    results[arm] = res
                equal &= results["cache"] == results["every answer run"] == results["cache + spread"]
            same &= equal
            best = {k: min(v) for k, v in walls.items()}
            rows.append({"step": step, "episodes": len(tasks), "skipped": skipped,
                         "distinct": len(set(zip((t.task_id for t in tasks), answers))),
                         "wall_s": best, "ratio_cache": best["cache"] / best["every answer run"],
                         "ratio_spread": best["cache + spread"] / best["every answer run"], "same_steps": equal})
            print(f"[step {step}] {rows[-1]}", flush=True)
    lines = ["| recorded step | answers (distinct) | every answer run | cache | cache + spread | "
             "cache / every | cache + spread / every | same steps |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        w = r["wall_s"]
        lines.append(f"| {r['step']} | {r['episodes']} ({r['distinct']}) | {w[ARMS[0]]:.3f} s | {w[ARMS[1]]:.3f} s | "
                     f"{w[ARMS[2]]:.3f} s | {r['ratio_cache']:.2f}x | {r['ratio_spread']:.2f}x | "
                     f"{'yes' if r['same_steps'] else 'NO'} |")
    prov = provenance()
    header = (f"Measured by `python benchmarks/verdict_cache.py` on commit `{prov['commit']}`, "
              f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores: the recorded answers of `{a.rollouts}` "
              f"stepped through code_sandbox envs, {a.workers} sandbox workers, {a.threads} env threads, "
              f"least wall time of {a.repeats} (arms alternating).")
    md = "# Verdict cache: one batch's env steps\n\n" + header + "\n\n" + "\n".join(lines) + "\n"
    out = {"args": vars(a), "rows": rows, "same_steps": same, "header": header, "provenance": prov}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    Path(a.md).write_text(md)
    print(md, flush=True)
    if not same:
        print("FAIL: a step differs with the cache", file=sys.stderr)
        raise SystemExit(1)
    return out


if __name__ == "__main__":
    main()
