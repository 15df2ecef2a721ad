"""The multi-turn code-repair job (`configs/code_repair.yaml`) on given seeds and settings:
held-out first-attempt pass@1, pass within 3 attempts and the repair rate before and after RL
(each with its standard error over tasks), wall time, and the cost profile of a step
(generation, sandbox, update), beside the single-turn job's step profile when asked.

    python benchmarks/code_repair.py                                  # seed 0, the job's defaults (GiGPO)
    python benchmarks/code_repair.py --seeds 0 1 2 --arms episode gigpo
    python benchmarks/code_repair.py --seeds 0 --single-turn          # + the 1-turn job's profile
    python benchmarks/code_repair.py --seeds 0 --arms single_turn     # the 1-turn job alone
    python benchmarks/code_repair.py --seeds 0 --tag short train.steps=50   # extra overrides

Arms: `gigpo` (the job's defaults, `algo.turn_credit=gigpo`), `branch2` (GiGPO on tree
rollouts, `rollout.branch=2`: four first attempts a group, each continued twice,
docs/algorithms.md), `episode` (plain GRPO on the
episode reward, `algo.turn_credit=episode`), `turn_adv` (`algo.turn_advantages=true` with
episode credit; every arm names its `rollout.branch`), `single_turn` (the single-turn main job, `--env code_sandbox --algo grpo`,
for its step profile and first-attempt pass@1 beside the multi-turn arms; `--single-turn` adds
it after each seed's arms). Each run is `python -m agentrl.cli train --config
configs/code_repair.yaml` in a subprocess, one at a time. Writes
`benchmarks/results/code_repair[_TAG].json` and `.md` (the table) and prints the table; the
run folders stay under `runs/code_repair/`. docs/learning.md quotes figures from these files only.
With `train.eval_every=N` the held-out evaluations during RL are a second table (step, first
attempt, pass within 3, gap, repair rate); `--tag T --add-curves` rewrites T's results with the
curves read from its run folders.

Targets (issue 40): after RL, pass within 3 attempts minus first-attempt pass@1 >= +0.10 on the
held-out set (256 tasks x 4 samples); repair rate after RL >= 1.5x before RL; first-attempt
pass@1 no lower than the single-turn job's on the same seed by more than two standard errors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CONFIG = ROOT / "configs" / "code_repair.yaml"
ARMS = {"episode": ["algo.turn_credit=episode", "rollout.branch=1"],
        "gigpo": ["algo.turn_credit=gigpo", "rollout.branch=1"],
        "turn_adv": ["algo.turn_credit=episode", "algo.turn_advantages=true", "rollout.branch=1"],
        "branch2": ["algo.turn_credit=gigpo", "rollout.branch=2"]}
METRICS = ("first_attempt_pass@1", "pass@1", "repair_rate", "attempts_mean")
PROFILE = ("generate", "env", "policy_update", "update", "step")


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def step_profile(metrics_path: Path) -> dict[str, float]:
    """Mean seconds per training step of `perf/<stage>_s` for the `PROFILE` stages, and the
    mean `rollout/turns`, over the run's step rows."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "perf/step_s" in r]
    out: dict[str, float] = {}
    for key in PROFILE:
        vals = [r[f"perf/{key}_s"] for r in steps if isinstance(r.get(f"perf/{key}_s"), (int, float))]
        if vals:
            out[f"{key}_s"] = sum(vals) / len(vals)
    turns = [r["rollout/turns"] for r in steps if "rollout/turns" in r]
    out["turns"] = sum(turns) / len(turns) if turns else float("nan")
    out["steps"] = len(steps)
    return out


CURVE = ("first_attempt_pass@1", "pass@1", "repair_rate")


def curve(metrics_path: Path) -> list[dict]:
    """The run's held-out evaluations in step order, from its metrics.jsonl: before RL (step 0),
    every `train.eval_every` steps, and after RL (the last step); each row is `step` and the
    `CURVE` metrics with their `_se` (None where the evaluation has none)."""
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    out = [{"step": r["step"], **{m: r.get(f"eval/{m}") for k in CURVE for m in (k, f"{k}_se")}}
           for r in rows if isinstance(r.get("eval/pass@1"), (int, float))]
    return sorted(out, key=lambda r: r["step"])


def run_one(seed: int, arm: str, out: Path, overrides: list[str], single_turn: bool = False) -> dict:
    """One run in a subprocess; returns its figures (or raises with the log's tail)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    base = (["--env", "code_sandbox", "--algo", "grpo"] if single_turn
            else ["--config", str(CONFIG), *ARMS[arm]])
    cmd = [sys.executable, "-m", "agentrl.cli", "train", *base, "--out", str(out), "--overwrite",
           "--quiet", f"seed={seed}", *overrides]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / f"{out.name}.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed (rc {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    s = json.loads((out / "summary.json").read_text())
    keep = [*METRICS, *(f"{m}_se" for m in METRICS)]
    return {"seed": seed, "arm": "single_turn" if single_turn else arm, "wall_s": wall,
            "sft_steps": s.get("sft_steps"), "sft_seconds": s.get("sft_seconds"),
            "before": {m: s["eval_before"].get(m) for m in keep},
            "after": {m: s["eval_after"].get(m) for m in keep},
            "step_profile": step_profile(out / "metrics.jsonl"), "curve": curve(out / "metrics.jsonl"),
            "cmd": cmd[3:]}


def _f(x: float | None, se: float | None = None) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:.3f}" + (f" ± {se:.3f}" if se is not None and se == se else "")


def table(results: list[dict]) -> str:
    """The Markdown table of the runs (one row per seed and arm)."""
    head = ("| arm | seed | warm-start steps | first-attempt pass@1 before -> after | pass within 3 "
            "before -> after | gap after | repair rate before -> after | ratio | wall | "
            "s/step: generate / sandbox / update (turns) |")
    lines = [head, "|" + " --- |" * 10]
    for r in results:
        b, a, p = r["before"], r["after"], r["step_profile"]
        if r["arm"] == "single_turn":  # one attempt: its pass@1 is the first attempt's
            b, a = ({"first_attempt_pass@1": x.get("pass@1"), "first_attempt_pass@1_se": x.get("pass@1_se"),
                     "pass@1": None} for x in (b, a))
        rb, ra = b.get("repair_rate"), a.get("repair_rate")
        gap = (a["pass@1"] - a["first_attempt_pass@1"]
               if None not in (a.get("pass@1"), a.get("first_attempt_pass@1")) else None)
        # an undefined repair rate (no failed first attempt) is null in summary.json (NaN in older runs): no ratio
        ratio = f"{ra / rb:.2f}x" if rb and rb == rb and ra is not None and ra == ra else "–"
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r.get('sft_steps')} | "
            f"{_f(b.get('first_attempt_pass@1'), b.get('first_attempt_pass@1_se'))} -> "
            f"{_f(a.get('first_attempt_pass@1'), a.get('first_attempt_pass@1_se'))} | "
            f"{_f(b.get('pass@1'), b.get('pass@1_se'))} -> {_f(a.get('pass@1'), a.get('pass@1_se'))} | "
            f"{_f(gap)} | {_f(rb, b.get('repair_rate_se'))} -> {_f(ra, a.get('repair_rate_se'))} | {ratio} | "
            f"{r['wall_s'] / 60:.1f} min | {p.get('generate_s', float('nan')):.2f} / "
            f"{p.get('env_s', float('nan')):.2f} / {p.get('update_s', float('nan')):.2f} ({p['turns']:.2f}) |")
    return "\n".join(lines)


def curve_table(results: list[dict]) -> str:
    """The Markdown table of the held-out evaluations during RL (`curve`; one row per
    evaluation of each run), empty when no run evaluated between before and after RL."""
    if not any(len(r.get("curve") or []) > 2 for r in results):
        return ""
    lines = ["| arm | seed | RL step | first-attempt pass@1 | pass within 3 | gap | repair rate |",
             "|" + " --- |" * 7]
    for r in results:
        for c in r.get("curve") or []:
            first, within = c.get("first_attempt_pass@1"), c.get("pass@1")
            gap = within - first if first is not None and within is not None else None
            lines.append(f"| {r['arm']} | {r['seed']} | {c['step']} | {_f(first, c.get('first_attempt_pass@1_se'))} | "
                         f"{_f(within, c.get('pass@1_se'))} | {_f(gap)} | "
                         f"{_f(c.get('repair_rate'), c.get('repair_rate_se'))} |")
    return "\n".join(lines)


def add_curves(name: str) -> str:
    """Rewrite `benchmarks/results/<name>.json|md` with each run's `curve` read from its run
    folder (`runs/<name>/<arm>_seed<N>/metrics.jsonl`): for results written before the curve
    was kept. Returns the curve table."""
    path = RESULTS / f"{name}.json"
    data = json.loads(path.read_text())
    for r in data["runs"]:
        folder = f"single_seed{r['seed']}" if r["arm"] == "single_turn" else f"{r['arm']}_seed{r['seed']}"
        r["curve"] = curve(ROOT / "runs" / name / folder / "metrics.jsonl")
    path.write_text(json.dumps(data, indent=1))
    _write_md(name, data["meta"], data["runs"])
    return curve_table(data["runs"])


def _write_md(name: str, meta: dict, results: list[dict]) -> str:
    md = table(results)
    curves = curve_table(results)
    (RESULTS / f"{name}.md").write_text(
        f"commit `{meta['commit']}`, {meta['date']}, load {meta['loadavg_start'][0]:.1f} -> "
        f"{meta['loadavg_end'][0]:.1f}\n\n{md}\n" + (f"\nHeld-out evaluations during RL:\n\n{curves}\n" if curves else ""))
    return md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=["gigpo"], choices=sorted([*ARMS, "single_turn"]))
    ap.add_argument("--single-turn", action="store_true", help="also run the single-turn main job per seed")
    ap.add_argument("--tag", default="")
    ap.add_argument("--add-curves", action="store_true",
                    help="only rewrite the results of --tag with each run's held-out curve from its run folder")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = ap.parse_args(argv)
    name = "code_repair" + (f"_{args.tag}" if args.tag else "")
    if args.add_curves:
        print(add_curves(name))
        return 0
    runs = ROOT / "runs" / name
    results: list[dict] = []
    t0 = time.time()
    load0 = os.getloadavg()
    commit, date = _commit(), time.strftime("%Y-%m-%d %H:%M")

    def save() -> str:  # after every run: a stopped benchmark keeps the runs it finished
        meta = {"commit": commit, "date": date, "machine": platform.node(), "cpus": os.cpu_count(),
                "loadavg_start": load0, "loadavg_end": os.getloadavg(), "seconds": time.time() - t0,
                "overrides": args.overrides}
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
        return _write_md(name, meta, results)

    for seed in args.seeds:
        for arm in args.arms:
            single = arm == "single_turn"
            results.append(run_one(seed, "episode" if single else arm,
                                   runs / (f"single_seed{seed}" if single else f"{arm}_seed{seed}"),
                                   args.overrides, single))
            save()
            print(table(results[-1:]), flush=True)
        if args.single_turn and "single_turn" not in args.arms:
            results.append(run_one(seed, "episode", runs / f"single_seed{seed}", args.overrides, True))
            save()
    print(save())
    return 0



if __name__ == "__main__":
    sys.exit(main())
