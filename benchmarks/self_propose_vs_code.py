"""Does self-proposed training help on real code tasks? (issue 25)

On the embedded model after the usual warm start (the main job's: `agentrl train --env
code_sandbox --algo grpo` builds the tiny model and warm-starts it on the code_sandbox training
split), held-out pass@1 before RL and after the same RL budget (the same steps, tasks per step,
group size and token limits) of

- (a) `self_propose` GRPO (`agentrl train --env self_propose model.path=<warm> sft.steps=0`), and
- (b) ordinary `code_sandbox` GRPO (the main job, shortened to the same number of steps),

measured on (1) the code_sandbox held-out split (`agentrl eval --env code_sandbox --split
heldout`: `train.eval_tasks` tasks x `train.eval_samples` samples at T = 1, the list `agentrl
train` evaluates) and (2) the first `--he-tasks` HumanEval problems
(`agentrl eval --dataset HumanEval.jsonl.gz`). Every run is the CLI in a subprocess.

The self_propose arm must never see a code_sandbox task (held-out or training split). Checked
after its run (`leak_check`), on every prompt of every step (`train.log_rollouts_every=1`) and on
its final task buffer: no prompt holds a code_sandbox statement, and every program it was shown
is run in the sandbox on each code_sandbox task's hidden-test inputs: a program that gives a
task's reference outputs on all of them "is" that task. Built-in tasks must match none (the
check fails the run otherwise); programs the policy proposed itself are counted and reported
(they can only come from its weights, i.e. the shared warm start).

    python benchmarks/self_propose_vs_code.py                  # 30 RL steps per arm, seed 0
    python benchmarks/self_propose_vs_code.py --steps 10 --he-tasks 20 --out /tmp/spvc
    python benchmarks/self_propose_vs_code.py --steps 10 --sp-warm 60 --warm /tmp/spvc/code_grpo/sft_model

`--sp-warm N` gives arm (a) a warm start of its own: N SFT steps on self_propose reference
answers (`SelfProposeEnv.reference_answer`: built from the seed tasks, never a code_sandbox task)
on top of the code warm start, before its RL (the code warm start, then the self_propose one:
sequential, not one mixed stage); the model between the two is evaluated too (`sp_warm`).
`--mix-warm SHARE` makes the shared warm start one mixed stage instead: the main job's run of arm
(b) gets `sft.mix_envs={self_propose: SHARE}`, so its SFT examples are the code_sandbox references
plus SHARE times as many self_propose references, shuffled together (the tokenizer of the embedded
model is trained on both envs' texts too); both arms start from that `sft_model`, so the
comparison stays fair, and the self_propose references teach the propose/solve formats without a
second stage that forgets code. Not with `--warm`.
`--warm DIR` reuses the code warm start of an earlier run (its `sft_model`): arm (b) is then
`agentrl train --env code_sandbox model.path=DIR sft.steps=0`, and `--no-warm-eval` skips
evaluating DIR again (its figures are the earlier run's: evaluation is deterministic).

`--min-warm-pass1 X` (with `--warm`) stops before the arms when the reused warm start's held-out
pass@1 (its run's evaluation before RL, `summary.json`) is below X: no code skill to move. With
`--warm` the results record that run's warm start (`warm_run`: SFT steps, examples per env, the
stop checks on code_sandbox training tasks, its `sft` config).

Besides each model's pass@1 (± its standard error over tasks), the results give paired
differences (`paired_pass@1`: per-task difference of success rates, mean ± standard error over
the common tasks) between the arms and against the warm start.

Writes benchmarks/results/self_propose_vs_code.json and .md (`--tag T`: ..._T.json/.md; and OUT/results.json).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
HUMANEVAL = ROOT.parent / "shared" / "data" / "HumanEval.jsonl.gz"
STATEMENT_PREFIX = "Write a Python function `"  # every code_sandbox statement starts so (code_tasks.STATEMENT)
_FENCE = re.compile(r"```(?:python|py|python3)?\n(.*?)```", re.S)


# -- the leak check ---------------------------------------------------------------------------------
def code_space() -> dict[str, Any]:
    """Every single-argument code_sandbox task key (template x parameters x argument names, both
    splits; the function name is not part of a key) with its hidden-test inputs and reference
    outputs as canonical text (`self_propose_tasks.canon`), grouped by argument kind so a program
    runs once per kind. Two-argument (`int2`) tasks are left out: `f(x)` takes one argument.

    Returns:
        `{"inputs": {kind: [input text, ...]}, "tasks": [{"key", "split", "kind", "idx": [input
        positions], "outputs": [canonical text]}]}`.
    """
    from agentrl_envs import code_tasks as ct
    from agentrl_envs.self_propose_tasks import canon

    inputs: dict[str, list[str]] = {}
    tasks = []
    for tpl in ct.TEMPLATES:
        if tpl.kind == "int2":
            continue
        for params in tpl.param_grid():
            for args in ct.ARG_NAMES[tpl.kind]:
                ins = list(ct.TEST_INPUTS[tpl.kind])
                if tpl.kind == "str" and tpl.c:
                    ins = ins[:-1] + [(ct.PROBE.format(c=params["c"]),)]
                ref = eval(f"lambda {args}: {tpl.expr.format(a=args, b=args, **params)}")  # noqa: S307 - our own templates
                pool = inputs.setdefault(tpl.kind, [])
                idx = []
                for (x,) in ins:
                    s = canon(x)
                    if s not in pool:
                        pool.append(s)
                    idx.append(pool.index(s))
                outs = [canon(ref(ct._copy(x))) for (x,) in ins]
                key = ct.task_key(tpl, params, args)
                tasks.append({"key": key, "split": ct.key_split(key), "kind": tpl.kind, "idx": idx,
                              "outputs": outs})
    return {"inputs": inputs, "tasks": tasks}


def behaviour_matches(src: str, space: dict[str, Any], pool: Any = None) -> list[dict[str, str]]:
    """The code_sandbox tasks program `src` (defining `f(x)`) solves: run in the sandbox (never
    here) on each kind's inputs, a task matches when every one of its hidden-test inputs gives
    its reference output (exact canonical text; an error never matches).

    Returns:
        `[{"key", "split"}]`, empty when none (or when the program does not run).
    """
    from agentrl.sandbox import Limits
    from agentrl.sandbox.pool import default_pool
    from agentrl_envs.self_propose_tasks import harness, read_outputs

    pool = pool or default_pool("auto")
    got: dict[str, list[str]] = {}
    for kind, ins in space["inputs"].items():
        res = pool.run_code(harness(src, ins), limits=Limits(wall_s=2.0, cpu_s=2.0, memory_mb=256))
        outs = read_outputs(res.stdout, len(ins)) if res.verdict == "pass" else None
        if outs is not None:
            got[kind] = outs
    return [{"key": t["key"], "split": t["split"]} for t in space["tasks"]
            if t["kind"] in got and all(got[t["kind"]][i] == o for i, o in zip(t["idx"], t["outputs"]))]


def shown_programs(text: str) -> list[str]:
    """The ```python blocks of a prompt that define `f` (the programs self_propose shows)."""
    out = []
    for block in _FENCE.findall(text):
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        if any(isinstance(n, ast.FunctionDef) and n.name == "f" for n in tree.body):
            out.append(block.strip())
    return out


def leak_check(prompts: list[str], buffer_tasks: list[dict[str, Any]], pool: Any = None) -> dict[str, Any]:
    """Did the self_propose run see a code_sandbox task? `prompts`: the user messages of all its
    training episodes; `buffer_tasks`: its final buffer (`Task.to_dict`s).

    Returns:
        `statement_prompts` (prompts holding a code_sandbox statement: must be 0),
        `builtin_matches` (built-in tasks behaving like a code_sandbox task: must be 0),
        `proposed_matches` (programs the policy proposed that do, with the splits they fall in),
        `programs_checked`, `prompts_checked`, and `ok` (the two musts).
    """
    from agentrl_envs.self_propose_tasks import HELDOUT_TASKS, SEED_TASKS, normalise

    space = code_space()
    builtin = {normalise(t.src) for t in (*SEED_TASKS, *HELDOUT_TASKS)}
    progs: dict[str, str] = {}  # normalised -> origin
    for t in buffer_tasks:
        progs.setdefault(normalise(t["src"]), "builtin" if normalise(t["src"]) in builtin else "proposed")
    for p in prompts:
        for src in shown_programs(p):
            try:
                n = normalise(src)
            except SyntaxError:
                continue
            progs.setdefault(n, "builtin" if n in builtin else "proposed")
    for t in (*SEED_TASKS, *HELDOUT_TASKS):
        progs.setdefault(normalise(t.src), "builtin")
    builtin_hits, proposed_hits = [], []
    for src, origin in sorted(progs.items()):
        hits = behaviour_matches(src, space, pool)
        if hits:
            row = {"program": src, "tasks": len(hits), "splits": sorted({h["split"] for h in hits}),
                   "example": hits[0]["key"]}
            (builtin_hits if origin == "builtin" else proposed_hits).append(row)
    statement = sum(STATEMENT_PREFIX in p for p in prompts)
    return {"prompts_checked": len(prompts), "programs_checked": len(progs),
            "code_tasks_compared": len(space["tasks"]), "statement_prompts": statement,
            "builtin_matches": builtin_hits, "proposed_matches": proposed_hits,
            "ok": statement == 0 and not builtin_hits}


# -- the runs ---------------------------------------------------------------------------------------
def cli(args: list[str], log: Path) -> float:
    """`python -m agentrl.cli ARGS` in a subprocess (log to `log`); returns its wall seconds.

    Raises:
        RuntimeError: it failed (with the log's tail).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", *args], env=env, capture_output=True, text=True)
    log.write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} failed (rc {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return time.perf_counter() - t0


def evaluate(model: Path, out: Path, seed: int, he_tasks: int, samples: int,
             overrides: list[str]) -> dict[str, Any]:
    """Held-out code_sandbox and HumanEval-subset pass@1 (and pass@`samples`) of `model`
    (`overrides`: the arms' config overrides, e.g. a smaller `train.eval_tasks`)."""
    res: dict[str, Any] = {}
    common = ["--samples", str(samples), "--k", f"1,{samples}", "--temperature", "1.0", "--seed", str(seed)]
    for name, extra in (("code_heldout", ["--split", "heldout"]),
                        ("humaneval", ["--dataset", str(HUMANEVAL), "--max-tasks", str(he_tasks)])):
        if name == "humaneval" and he_tasks == 0:  # --he-tasks 0: not evaluated (n/a)
            res[name] = {}
            continue
        d = out / name
        wall = cli(["eval", "--env", "code_sandbox", "--model", str(model), "--out", str(d), *common, *extra,
                    *overrides],
                   out / f"{name}.log")
        s = json.loads((d / "summary.json").read_text())["overall"]
        res[name] = {k: s.get(k) for k in ("pass@1", "pass@1_se", f"pass@{samples}", f"pass@{samples}_se",
                                           "tasks", "episodes")} | {"wall_s": wall, "verdicts": verdict_counts(d)}
    return res


def paired_diff(dir_a: Path, dir_b: Path) -> dict[str, Any] | None:
    """pass@1 of evaluation B minus that of evaluation A (two `agentrl eval` folders of the same
    task list), paired over tasks: each task's difference of success rates d_i = c_b/n - c_a/n
    (`agentrl.eval.report.compare`'s per-task `success_rate`), their mean and its standard error
    std(d, ddof=1) / sqrt(T) over the T common tasks (0 when T = 1); `gained` / `lost`: tasks
    solved (at least once) in B only / in A only.

    Returns:
        `{"diff", "se", "tasks", "gained", "lost"}`, or None when either folder is missing (an
        evaluation that was not run, e.g. HumanEval with `--he-tasks 0`).
    """
    from agentrl.eval.report import compare

    if not ((dir_a / "summary.json").exists() and (dir_b / "summary.json").exists()):
        return None
    c = compare(dir_a, dir_b)
    d = [t["success_rate"]["diff"] for t in c["tasks"]]
    n = len(d)
    mean = sum(d) / n
    se = (sum((x - mean) ** 2 for x in d) / (n - 1) / n) ** 0.5 if n > 1 else 0.0
    return {"diff": mean, "se": se, "tasks": n, "gained": len(c["flipped"]["gained"]),
            "lost": len(c["flipped"]["lost"])}


def warm_run(warm: Path) -> dict[str, Any] | None:
    """What made a reused warm start (`--warm DIR`, DIR = a training run's `sft_model`): that
    run's `summary.json` warm-start fields, its held-out evaluation before RL, the stop checks of
    its warm start (`sft_metrics.jsonl` rows with `sft/train_pass@1`: pass@1 and pass@k on
    training tasks) and its `sft` config. None when DIR's parent is not a run folder."""
    run = warm.parent
    if not (run / "summary.json").exists():
        return None
    s = json.loads((run / "summary.json").read_text())
    checks = []
    if (run / "sft_metrics.jsonl").exists():
        checks = [r for r in map(json.loads, (run / "sft_metrics.jsonl").read_text().splitlines())
                  if "sft/train_pass@1" in r]
    out = {k: s.get(k) for k in ("sft_steps", "sft_examples", "sft_loss_first", "sft_loss_last", "sft_seconds")}
    out["eval_before"] = {k: (s.get("eval_before") or {}).get(k) for k in ("pass@1", "pass@1_se")}
    out["stop_checks"] = checks
    if (run / "config.json").exists():  # the run's resolved config (agentrl.train writes it)
        cfg = json.loads((run / "config.json").read_text())
        out["sft_config"] = cfg.get("sft")
        out["seed"] = cfg.get("seed")
    return out


def buffer_programs(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The final task buffer (`Task.to_dict`s) of a self_propose run: `tasks`, `distinct_programs`
    (normalised sources, inputs ignored) and the normalised programs not among the built-in tasks
    (`proposed_programs`, sorted)."""
    from agentrl_envs.self_propose_tasks import HELDOUT_TASKS, SEED_TASKS, normalise

    builtin = {normalise(t.src) for t in (*SEED_TASKS, *HELDOUT_TASKS)}
    progs = {normalise(t["src"]) for t in tasks}
    return {"tasks": len(tasks), "distinct_programs": len(progs), "proposed_programs": sorted(progs - builtin)}


def verdict_counts(eval_dir: Path) -> dict[str, int]:
    """Episodes per sandbox verdict (`pass`, `fail`, `syntax_error`, `runtime_error`, ...; `none`
    when an episode has none) of an `agentrl eval` folder's `results.jsonl`, most common first."""
    from collections import Counter

    c = Counter(json.loads(x).get("verdict") or "none" for x in (eval_dir / "results.jsonl").read_text().splitlines())
    return dict(c.most_common())


def results_paths(tag: str) -> tuple[Path, Path]:
    """benchmarks/results/self_propose_vs_code[_TAG].json and .md (`--tag`, e.g. one per seed)."""
    stem = "self_propose_vs_code" + (f"_{tag}" if tag else "")
    return RESULTS / f"{stem}.json", RESULTS / f"{stem}.md"


def weight_change(a: Path, b: Path) -> float:
    """Largest absolute difference between the weights of two model folders (model.safetensors)."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


def rollout_prompts(run: Path) -> list[str]:
    """The user messages of every logged training episode of `run` (OUT/rollouts/*.jsonl)."""
    out = []
    for f in sorted((run / "rollouts").glob("step_*.jsonl")):
        for line in f.read_text().splitlines():
            for m in json.loads(line).get("messages", []):
                if m.get("role") == "user" and isinstance(m.get("content"), str):
                    out.append(m["content"])
    return out


def failure_reasons(run: Path, top: int = 8) -> list[list[Any]]:
    """The most common (group key, why the episode failed) of a self_propose run's logged
    episodes: `invalid_reason` for proposals, the first words of `error` for answers."""
    from collections import Counter

    c: Counter[tuple[str, str]] = Counter()
    for f in sorted((run / "rollouts").glob("step_*.jsonl")):
        for line in f.read_text().splitlines():
            t = json.loads(line)
            if not t.get("turns"):
                continue
            info = t["turns"][-1].get("info", {})
            if info.get("success"):
                continue
            why = info.get("invalid_reason") or ""
            err = str(info.get("error") or "")
            c[(t.get("info", {}).get("group_key", "?"), f"{why}: {err}"[:60] if why else err[:60])] += 1
    return [[k[0], k[1], n] for k, n in c.most_common(top)]


def group_counts(run: Path) -> dict[str, dict[str, int]]:
    """Per group key (`propose`, `solve/deduce`, ...) of a self_propose run's logged episodes:
    `episodes` and `success` (a valid proposal; a right answer), over all steps and at the first
    step (sampled by the warm-started weights, before any update)."""
    out: dict[str, dict[str, int]] = {}
    files = sorted((run / "rollouts").glob("step_*.jsonl"), key=lambda f: int(f.stem.split("_")[1]))
    for f in files:
        first = f == files[0]
        for line in f.read_text().splitlines():
            t = json.loads(line)
            if not t.get("turns"):
                continue
            c = out.setdefault(t.get("info", {}).get("group_key", "?"),
                               {"episodes": 0, "success": 0, "first_step_episodes": 0, "first_step_success": 0})
            ok = int(bool(t["turns"][-1].get("info", {}).get("success")))
            c["episodes"] += 1
            c["success"] += ok
            if first:
                c["first_step_episodes"] += 1
                c["first_step_success"] += ok
    return out


def arm_metrics(run: Path) -> dict[str, Any]:
    """Means over the RL steps of a run's per-role metrics, and its RL seconds."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/reward_mean" in r]
    keys = sorted({k for r in rows for k in r if k.startswith(("rollout/", "env/")) and
                   (k.endswith(("pass_rate", "reward_mean", "buffer_size", "proposal_diversity")))})
    out = {k: sum(r[k] for r in rows if k in r) / max(1, sum(k in r for r in rows)) for k in keys}
    s = json.loads((run / "summary.json").read_text())
    out.update({"steps": len(rows), "rl_s": s.get("rl_s"), "sft_steps": s.get("sft_steps"),
                "sft_examples": s.get("sft_examples"), "sft_loss": [s.get("sft_loss_first"), s.get("sft_loss_last")],
                "eval_before": {k: s["eval_before"].get(k) for k in ("pass@1", "pass@1_se")},
                "eval_after": {k: s["eval_after"].get(k) for k in ("pass@1", "pass@1_se")}})
    if rows and "env/buffer_size" in rows[-1]:
        out["final_buffer_size"] = rows[-1]["env/buffer_size"]
    return out


def commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    h = git("rev-parse", "--short", "HEAD") or "unknown"
    return h + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def markdown(res: dict[str, Any]) -> str:
    """The results table (benchmarks/results/self_propose_vs_code.md)."""
    k = res["eval_samples"]
    lines = [f"# self_propose vs code_sandbox GRPO (seed {res['seed']}, commit `{res['commit']}`, {res['date']})", "",
             f"Command: `{res['command']}`; {res['steps']} RL steps per arm x {res['tasks_per_step']} tasks x "
             f"{res['group_size']} samples; total {res['total_s'] / 60:.1f} min on {os.cpu_count()} cores.", "",
             f"Held-out code: {res['models']['code_grpo']['code_heldout']['tasks']} code_sandbox held-out tasks x {k} "
             "samples at T=1; HumanEval: " + (f"the first {res['he_tasks']} problems x {k} samples" if res["he_tasks"]
                                              else "not evaluated (--he-tasks 0)") + ". ± one standard "
             "error over tasks.", "",
             f"| model | code held-out pass@1 | pass@{k} | HumanEval pass@1 | pass@{k} |", "| --- | --- | --- | --- | --- |"]
    wr = res.get("warm_run") or {}
    ex = (wr.get("sft_examples") if wr else res["arms"]["code_grpo"].get("sft_examples")) or {}
    n_sft = wr.get("sft_steps") if wr else res["arms"]["code_grpo"]["sft_steps"]
    warm_label = ("mixed warm start (before RL): " + " + ".join(f"{n} {e}" for e, n in ex.items())
                  + f" references, {n_sft} SFT steps"
                  if len(ex) > 1 else "warm start (before RL)")
    for name, label in (("warm", warm_label),
                        ("sp_warm", f"warm start + {res.get('sp_warm', 0)} SFT steps on self_propose references"),
                        ("self_propose", "(a) + self_propose GRPO"), ("code_grpo", "(b) + code_sandbox GRPO")):
        m = res["models"].get(name)
        if m is None:
            continue
        c, h = m["code_heldout"], m["humaneval"]

        def f(d: dict[str, Any], key: str) -> str:
            v, se = d.get(key), d.get(f"{key}_se")
            return "n/a" if v is None else f"{v:.3f}" + (f" ± {se:.3f}" if se is not None else "")

        lines.append(f"| {label} | {f(c, 'pass@1')} | {f(c, f'pass@{k}')} | {f(h, 'pass@1')} | {f(h, f'pass@{k}')} |")
    verdicts = {n: m["code_heldout"]["verdicts"] for n, m in res["models"].items() if m["code_heldout"].get("verdicts")}
    if verdicts:
        lines += ["", "Code held-out episodes per sandbox verdict: " + "; ".join(
            f"{n} " + ", ".join(f"{v} {c_}" for v, c_ in vs.items()) for n, vs in verdicts.items()) + "."]
    a = res["arms"]["self_propose"]
    lk = res["leak_check"]
    own = res["arms"]["code_grpo"]["sft_steps"]
    lines += ["", f"Wall: code_sandbox arm {res['train_walls_s']['code_grpo'] / 60:.1f} min ("
              + (f"warm start {own} SFT steps included; " if own else "warm start reused, not included; ")
              + f"RL {res['arms']['code_grpo']['rl_s']:.0f} s), "
              f"self_propose arm {res['train_walls_s']['self_propose'] / 60:.1f} min (RL "
              f"{res['arms']['self_propose']['rl_s']:.0f} s); load average {res['load_1min']:.1f} at the end."]
    lines += ["", "self_propose arm (means over its steps): " + ", ".join(
        f"{key.split('rollout/')[-1]} {v:.3f}" for key, v in a.items()
        if isinstance(v, float) and key.endswith("pass_rate")) + f"; final buffer {a.get('final_buffer_size')}" + (
            f" tasks, {res['final_buffer']['distinct_programs']} distinct programs, proposed ones: "
            + ", ".join(f"`{p_}`" for p_ in res["final_buffer"]["proposed_programs"][:12]).replace("\n", " ")
            if res.get("final_buffer") else "") + ".",
        "", "self_propose episodes per group, successes (valid proposals; right answers) / episodes, all "
        "steps (first step, before any update): " + "; ".join(
            f"{g} {c['success']}/{c['episodes']} ({c['first_step_success']}/{c['first_step_episodes']})"
            for g, c in sorted(res.get("self_propose_groups", {}).items())) + ".",
        "", f"Leak check: {lk['prompts_checked']} training prompts, {lk['programs_checked']} programs run against "
        f"{lk['code_tasks_compared']} code_sandbox tasks: statements in prompts {lk['statement_prompts']}, "
        f"built-in tasks matching {len(lk['builtin_matches'])}, policy-proposed programs matching "
        f"{len(lk['proposed_matches'])} -> {'ok' if lk['ok'] else 'FAILED'}.", "",
        "Paired pass@1 differences (mean over tasks of the per-task difference of success rates "
        "± its standard error; tasks solved in the second model only / in the first only): " + ("; ".join(
            f"{name} {d['diff']:+.3f} ± {d['se']:.3f} over {d['tasks']} tasks (gained {d['gained']}, "
            f"lost {d['lost']})" for name, d in res.get("paired_pass@1", {}).items()) or "none") + ".", "",
        *([f"Warm start (`{res['warm']}`, reused): {wr.get('sft_steps')} SFT steps, loss "
           f"{wr.get('sft_loss_first') or 0:.2f} -> {wr.get('sft_loss_last') or 0:.2f}; stop checks on code_sandbox "
           "training tasks (step: pass@1 / pass@k): " + ", ".join(
               f"{c['step']}: {c['sft/train_pass@1']:.3f}/" + next(
                   (f"{v:.3f}" for k2, v in c.items() if k2.startswith("sft/train_pass@") and k2 != "sft/train_pass@1"),
                   "-") for c in wr.get("stop_checks", [])) + f"; sft config {json.dumps(wr.get('sft_config'))}.", ""]
          if wr else []),
        "Largest absolute weight change from the warm start: " + ", ".join(
            f"{n} {v:.3g}" for n, v in res["max_abs_weight_change"].items()) + ".", "",
        "Most common self_propose failures (group, reason, episodes): " + "; ".join(
            f"{g} `{r}` {n}" for g, r, n in res["self_propose_failures"]) + ".", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0].replace(" (issue 25)", ""))
    ap.add_argument("--steps", type=int, default=30, help="RL steps per arm (default 30; the docs' runs used 40, the main job runs 360)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the warm start and both arms")
    ap.add_argument("--he-tasks", type=int, default=40, help="HumanEval problems evaluated (the first N; 0: none)")
    ap.add_argument("--out", default="/tmp/agentrl_self_propose_vs_code", help="folder of the runs (warm start, arms)")
    ap.add_argument("--sp-warm", type=int, default=0,
                    help="SFT steps of arm (a) on self_propose reference answers before its RL (0: none)")
    ap.add_argument("--mix-warm", type=float, default=0.0,
                    help="share of self_propose references mixed into the shared warm start "
                         "(sft.mix_envs={self_propose: SHARE} for arm (b)'s run; 0: none)")
    ap.add_argument("--warm", default=None, help="reuse this code warm start (an earlier run's sft_model)")
    ap.add_argument("--no-warm-eval", action="store_true", help="do not evaluate the code warm start")
    ap.add_argument("--min-warm-pass1", type=float, default=None,
                    help="with --warm: stop before the arms when the warm start's held-out pass@1 (its run's "
                         "evaluation before RL) is below this")
    ap.add_argument("--tag", default="", help="results file name suffix: self_propose_vs_code_TAG.json/.md")
    ap.add_argument("--no-results", action="store_true", help="do not write benchmarks/results (a smoke run)")
    ap.add_argument("overrides", nargs="*", help="config overrides key=value for both arms (e.g. sft.steps=20)")
    args = ap.parse_args()
    if args.mix_warm and args.warm:
        ap.error("--mix-warm makes the warm start; it cannot reuse one (--warm)")
    from agentrl.config import load_config

    cfg = load_config(None, args.overrides)
    started_at = commit()  # the code the run starts on (not HEAD at its end)
    warm_info = warm_run(Path(args.warm)) if args.warm else None
    if args.min_warm_pass1 is not None:
        got = (warm_info or {}).get("eval_before", {}).get("pass@1")
        if got is None:
            ap.error("--min-warm-pass1 needs --warm DIR inside a training run folder (its summary.json)")
        if got < args.min_warm_pass1:
            raise SystemExit(f"warm start's held-out pass@1 {got:.3f} < --min-warm-pass1 {args.min_warm_pass1}: "
                             "no code skill for the arms to move; not running them")
    samples = cfg.train.eval_samples
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    code_run, sp_run = out / "code_grpo", out / "self_propose"
    common = ["--algo", "grpo", "--steps", str(args.steps), "--overwrite", "--quiet", f"seed={args.seed}",
              "train.save_every=0", *args.overrides]
    # (b), which also makes the warm start: the main job, shortened to --steps RL steps
    reuse = [f"model.path={args.warm}", "sft.steps=0"] if args.warm else []
    if args.mix_warm:
        reuse = [f"sft.mix_envs={{self_propose: {args.mix_warm}}}"]
    walls = {"code_grpo": cli(["train", "--env", "code_sandbox", "--out", str(code_run), *common, *reuse],
                              out / "code_grpo.log")}
    warm = Path(args.warm) if args.warm else code_run / "sft_model"
    # (a) from the same warm-started weights (+ its own warm start with --sp-warm); every prompt
    # logged for the leak check
    sp_sft = ([f"sft.steps={args.sp_warm}", "sft.stop_pass_rate=null", "sft.stop_pass_at_k=null"]
              if args.sp_warm else ["sft.steps=0"])
    walls["self_propose"] = cli(["train", "--env", "self_propose", "--out", str(sp_run), *common,
                                 f"model.path={warm}", *sp_sft, "train.log_rollouts_every=1"],
                                out / "self_propose.log")
    final = f"checkpoints/step_{args.steps}"
    models = {}
    todo = ([] if args.no_warm_eval else [("warm", warm)]) + (
        [("sp_warm", sp_run / "sft_model")] if args.sp_warm else []) + [
        ("self_propose", sp_run / final), ("code_grpo", code_run / final)]
    for name, path in todo:
        models[name] = evaluate(path, out / f"eval_{name}", args.seed, args.he_tasks, samples,
                                args.overrides)
    state = json.loads((sp_run / final / "agentrl_state.json").read_text())
    lk = leak_check(rollout_prompts(sp_run), state["env_state"]["buffer"]["tasks"])
    moved = {name: weight_change(warm, run / final) for name, run in (("self_propose", sp_run),
                                                                      ("code_grpo", code_run))}
    if args.sp_warm:
        moved["self_propose_rl_only"] = weight_change(sp_run / "sft_model", sp_run / final)
    names = list(models)
    paired = {}
    for a_, b_ in (("warm", "self_propose"), ("warm", "code_grpo"), ("code_grpo", "self_propose")):
        if a_ in names and b_ in names:
            for ev in ("code_heldout", "humaneval"):
                d = paired_diff(out / f"eval_{a_}" / ev, out / f"eval_{b_}" / ev)
                if d is not None:
                    paired[f"{ev}: {b_} - {a_}"] = d
    res = {"commit": started_at, "final_buffer": buffer_programs(state["env_state"]["buffer"]["tasks"]), "warm_run": warm_info, "paired_pass@1": paired, "date": time.strftime("%Y-%m-%d"), "seed": args.seed, "steps": args.steps,
           "sp_warm": args.sp_warm, "mix_warm": args.mix_warm, "warm": str(warm),
           "tasks_per_step": cfg.rollout.tasks_per_step, "group_size": cfg.algo.group_size,
           "eval_samples": samples, "he_tasks": args.he_tasks, "overrides": args.overrides,
           "command": "python benchmarks/self_propose_vs_code.py " + " ".join(sys.argv[1:]),
           "models": models, "arms": {"code_grpo": arm_metrics(code_run), "self_propose": arm_metrics(sp_run)},
           "self_propose_failures": failure_reasons(sp_run), "self_propose_groups": group_counts(sp_run), "train_walls_s": walls, "leak_check": lk, "max_abs_weight_change": moved, "total_s": time.perf_counter() - t_all,
           "load_1min": os.getloadavg()[0]}
    (out / "results.json").write_text(json.dumps(res, indent=1))  # before the table: kept if it fails
    if not args.no_results:
        RESULTS.mkdir(exist_ok=True)
        results_paths(args.tag)[0].write_text(json.dumps(res, indent=1))
    md = markdown(res)
    print(md)
    if not args.no_results:
        results_paths(args.tag)[1].write_text(md)
    if not lk["ok"]:
        raise SystemExit(f"leak check failed: {json.dumps(lk)[:2000]}")


if __name__ == "__main__":
    main()
