"""code_sandbox env (real sandbox), the built-in task family, and the toy env."""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.env.registry import make_env
from agentrl.sandbox import Limits
from agentrl.sandbox.pool import default_pool
from agentrl_envs import code_tasks
from agentrl_envs.code_datasets import CodeTask, task_from_dict
from agentrl_envs.code_sandbox import (
    CodeSandboxEnv,
    build_program,
    extract_code,
    feedback_message,
    sandbox_job,
)
from agentrl_envs.toy import ToyEnv

ADD7 = {  # built-in format
    "task_id": "t/add_seven", "entry_point": "add_seven",
    "prompt": "Write a Python function `add_seven(x)` that returns x plus 7.",
    "tests": ["assert add_seven(0) == 7", "assert add_seven(3) == 10"],
    "solution": "def add_seven(x):\n    return x + 7\n",
}
WRONG = "def add_seven(x):\n    return x + 6"
RIGHT = "```python\ndef add_seven(x):\n    return x + 7\n```"
FAIL_FEEDBACK = ("Your code failed: test_0: AssertionError (at `assert add_seven(0) == 7`)\n"
                 "Tests passed: 0/2.\nFix the function and answer with the complete code.")


@pytest.fixture(scope="module")
def pool():
    """The process-wide pool, which envs made without `pool=` use too (closed at exit)."""
    return default_pool("auto")


# -- the env -----------------------------------------------------------------------------------

def test_check_env_passes(pool):
    env = make_env("code_sandbox")  # check_env re-makes it from its spec (kwargs deep-copied)
    check_env(env.unwrapped, skip_render_check=True)
    check_env(CodeSandboxEnv(pool=pool), skip_render_check=True)


def test_g1_same_seed_same_task_sequence(pool):
    def seq(env):
        ids = [env.reset(seed=123)[1]["task_id"]]
        ids += [env.reset()[1]["task_id"], env.reset()[1]["task_id"]]
        return ids

    random.seed(5)
    np.random.seed(5)
    before = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    a = seq(CodeSandboxEnv(pool=pool))
    b = seq(make_env("code_sandbox"))
    assert a == b
    assert len(set(a)) == 3  # three draws, three different tasks (fails if reset ignores its rng)
    assert seq(CodeSandboxEnv(pool=pool)) == a
    other = CodeSandboxEnv(pool=pool)
    assert [other.reset(seed=124)[1]["task_id"]] != a[:1]
    # the env never draws from the global RNGs
    assert (random.random(), np.random.random()) == before


def test_scripted_multi_turn_episode(pool):
    env = CodeSandboxEnv(max_turns=3, pool=pool)
    obs, info = env.reset(options={"task": ADD7})
    assert obs == [{"role": "system", "content": "Answer with a Python function."},
                   {"role": "user", "content": ADD7["prompt"]}]
    assert info["task_id"] == "t/add_seven"
    obs, r, term, trunc, info = env.step(WRONG)
    assert obs == [{"role": "user", "content": FAIL_FEEDBACK}]
    assert (r, term, trunc) == (0.0, False, False)
    assert info["verdict"] == "fail" and (info["passed"], info["total"]) == (0, 2)
    assert info["error"] == "test_0: AssertionError (at `assert add_seven(0) == 7`)"
    obs, r, term, trunc, info = env.step(RIGHT)
    assert (obs, r, term, trunc) == ([], 1.0, True, False)
    assert info["verdict"] == "pass" and info["success"] and info["turn"] == 2
    assert info["wall_s"] > 0 and info["task_id"] == "t/add_seven"


def test_max_turns_truncates_and_turn_penalty(pool):
    env = CodeSandboxEnv(max_turns=2, turn_penalty=0.1, pool=pool)
    env.reset(options={"task": ADD7})
    _, r1, term, trunc, _ = env.step(WRONG)
    assert (r1, term, trunc) == (0.0, False, False)
    obs, r2, term, trunc, info = env.step(WRONG)
    assert obs == [] and (term, trunc) == (False, True)
    assert r2 == pytest.approx(-0.1)  # 0 - penalty on turn 2
    # a pass on turn 2 earns 1 - 0.1
    env.reset(options={"task": ADD7})
    env.step(WRONG)
    assert env.step(RIGHT)[1:4] == (pytest.approx(0.9), True, False)


def test_repeat_penalty_and_repeat_flag(pool):
    """An attempt whose code is an earlier attempt's (trailing spaces aside, fences or not) is
    flagged `repeat` and loses `repeat_penalty`; a new wrong attempt is not; a new episode
    forgets the earlier attempts; without the penalty the flag is still set."""
    env = CodeSandboxEnv(max_turns=4, turn_penalty=0.1, repeat_penalty=0.5, pool=pool)
    env.reset(options={"task": ADD7})
    first = env.step(WRONG)
    assert first[1] == 0.0 and first[4]["repeat"] is False
    again = env.step("```python\n" + WRONG.replace("\n", "   \n") + "\n```")  # same code
    assert again[4]["verdict"] == "fail" and again[4]["repeat"] is True
    assert again[1] == pytest.approx(-0.6)  # 0 - turn penalty - repeat penalty
    other = env.step("def add_seven(x):\n    return 0")
    assert other[4]["repeat"] is False and other[1] == pytest.approx(-0.1)
    env.reset(options={"task": ADD7})
    assert env.step(WRONG)[4]["repeat"] is False  # a new episode
    plain = CodeSandboxEnv(max_turns=2, pool=pool)
    plain.reset(options={"task": ADD7})
    plain.step(WRONG)
    _, r, _, _, info = plain.step(WRONG)
    assert (r, info["repeat"]) == (0.0, True)
    with pytest.raises(ValueError, match="repeat_penalty"):
        CodeSandboxEnv(repeat_penalty=-1, pool=pool)


def test_own_turn_limit_agrees_with_gymnasium_time_limit(pool):
    """max_turns in the env and a TimeLimit on top truncate at the same step (G2: the smaller
    limit wins)."""
    flags = []
    for env in (CodeSandboxEnv(max_turns=2, pool=pool),
                gym.wrappers.TimeLimit(CodeSandboxEnv(max_turns=5, pool=pool), 2),
                gym.wrappers.TimeLimit(CodeSandboxEnv(max_turns=2, pool=pool), 10),
                make_env("code_sandbox", max_turns=2)):
        if env.unwrapped.max_turns == 1:
            env.unwrapped.max_turns = 5  # make_env's TimeLimit alone must stop it at 2
        env.reset(options={"task": ADD7})
        flags.append([env.step(WRONG)[2:4] for _ in range(2)])
    assert flags == [[(False, False), (False, True)]] * 4


def test_make_env_forwards_max_turns_as_attempts():
    """`make_env(..., max_turns=3)` gives code_sandbox 3 attempts (its own kwarg), unless the
    env kwargs set `max_turns` themselves; envs without the kwarg only get the TimeLimit."""
    assert make_env("code_sandbox", max_turns=3).unwrapped.max_turns == 3
    env = make_env("code_sandbox", max_turns=3, env_kwargs={"max_turns": 2})
    assert env.unwrapped.max_turns == 2  # the env's own kwarg wins; the TimeLimit of 3 stays
    assert make_env("code_sandbox").unwrapped.max_turns == 1
    toy = make_env("toy", max_turns=2)
    assert isinstance(toy, gym.wrappers.TimeLimit) and toy._max_episode_steps == 2


def test_reward_modes(pool):
    half = "def add_seven(x):\n    return 7"  # passes add_seven(0) == 7 only
    rewards = {}
    for mode in ("binary", "fraction"):
        env = CodeSandboxEnv(reward=mode, pool=pool)
        env.reset(options={"task": ADD7})
        _, rewards[mode], term, trunc, info = env.step(half)
        assert (term, trunc) == (True, False)  # single attempt: graded, terminated
        assert (info["passed"], info["total"]) == (1, 2)
    assert rewards == {"binary": 0.0, "fraction": 0.5}
    with pytest.raises(ValueError, match="reward"):
        CodeSandboxEnv(reward="partial")


@pytest.mark.parametrize("action, verdict", [
    ("", "no_code"), ("```python\n```", "no_code"), (12345, "bad_action"),
    ("def add_seven(x) return 7", "syntax_error"), ("import sys; sys.exit(0)", "runtime_error"),
])
def test_bad_answers_are_recorded_zero_reward_steps(pool, action, verdict):
    env = CodeSandboxEnv(pool=pool)
    env.reset(options={"task": ADD7})
    obs, r, term, trunc, info = env.step(action)
    assert (r, info["verdict"], info["success"]) == (0.0, verdict, False)
    assert info["error"] and term and not trunc


def test_timeout_is_a_zero_reward_step(pool):
    env = CodeSandboxEnv(max_turns=2, limits={"wall_s": 1.0, "cpu_s": 1.0}, pool=pool)
    env.reset(options={"task": ADD7})
    obs, r, term, trunc, info = env.step("while True:\n    pass")
    assert (r, info["verdict"]) == (0.0, "timeout")
    assert obs[0]["content"].startswith("Your code failed: wall time limit of 1 s exceeded")
    assert env.step(RIGHT)[1] == 1.0  # the worker is still usable


def test_sandbox_failure_is_recorded_not_raised():
    class BrokenPool:  # a fake only to inject the fault
        def run_tests(self, **kw):
            raise OSError("bwrap vanished")

    env = CodeSandboxEnv(pool=BrokenPool())
    env.reset(options={"task": ADD7})
    _, r, _, _, info = env.step(RIGHT)
    assert (r, info["verdict"]) == (0.0, "sandbox_error")
    assert "bwrap vanished" in info["error"]


def test_step_after_end_and_before_reset(pool):
    env = CodeSandboxEnv(pool=pool)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(RIGHT)
    env.reset(options={"task": ADD7})
    env.step(RIGHT)
    obs, r, term, trunc, info = env.step(RIGHT)
    assert (obs, r, term) == ([], 0.0, True) and "ended" in info["error"]


def test_options_task_in_three_formats(pool):
    humaneval = {"task_id": "HE/x", "entry_point": "add",
                 "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
                 "canonical_solution": "    return a + b\n",
                 "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"}
    mbpp = {"task_id": 9, "text": "Write a function to add two numbers.",
            "code": "def add(a, b):\n    return a + b", "test_list": ["assert add(2, 3) == 5"],
            "test_setup_code": ""}
    sanitized = {"task_id": 9, "prompt": "Write a function to add two numbers.",
                 "code": "def add(a, b):\n    return a + b", "test_imports": [],
                 "test_list": ["assert add(2, 3) == 5"]}
    env = CodeSandboxEnv(pool=pool)
    for task in (humaneval, mbpp, sanitized, ADD7):
        obs, info = env.reset(options={"task": task})
        ref = env.reference_answer()
        assert env.step(ref)[1] == 1.0, task
    # HumanEval: a body completion (prompt prepended) and a full function both pass
    env.reset(options={"task": humaneval})
    assert env.step("    return a + b")[1] == 1.0
    env.reset(options={"task": humaneval})
    assert env.step("```python\ndef add(a, b):\n    return a + b\n```")[1] == 1.0
    env.reset(options={"task": humaneval})
    assert env.step("    return a - b")[1] == 0.0
    assert "Your code should pass this test:\nassert add(2, 3) == 5" in env.reset(
        options={"task": mbpp})[0][1]["content"]
    with pytest.raises(ValueError, match="unknown format"):
        env.reset(options={"task": {"question": "?"}})


def test_task_index_and_tasks_by_split(pool):
    env = CodeSandboxEnv(pool=pool, num_tasks=40)
    train, held = env.tasks("train"), env.tasks("heldout")
    assert len(train) == len(held) == 40
    assert not {t.meta["key"] for t in train} & {t.meta["key"] for t in held}
    assert env.reset(options={"task_index": 3})[1]["task_id"] == train[3].task_id
    assert env.tasks("test") is held  # alias
    with pytest.raises(ValueError, match="out of range"):
        env.reset(options={"task_index": 40})
    # the held-out env draws held-out tasks only
    h = CodeSandboxEnv(split="heldout", pool=pool)
    assert all(h.reset(seed=s)[1]["task_id"] and h.task.meta["split"] == "heldout" for s in range(20))


def test_reference_solutions_of_builtin_tasks_pass_and_wrong_fail(pool):
    tasks = code_tasks.generate_tasks("train", 60, 1) + code_tasks.generate_tasks("heldout", 60, 1)
    good = pool.map_tests([sandbox_job(t, t.solution) for t in tasks])
    bad = pool.map_tests([sandbox_job(t, f"def {t.entry_point}(*a, **k):\n    return None")
                          for t in tasks])
    assert [r.verdict for r in good] == ["pass"] * len(tasks)
    assert all(r.verdict == "fail" and r.passed < r.total for r in bad)


def test_corpus_and_reference_answer():
    env = CodeSandboxEnv()
    assert env.reference_answer() is None
    env.reset(seed=0)
    assert env.reference_answer() == env.task.solution.rstrip("\n")
    texts = env.corpus_texts(5)
    assert texts[0] == "Answer with a Python function." and len(texts) == 1 + 5 + 4
    assert all(t.endswith("Fix the function and answer with the complete code.") for t in texts[1:])


# -- extraction and program assembly -------------------------------------------------------------

@pytest.mark.parametrize("text, code", [
    ("def f():\n    return 1\n", "def f():\n    return 1"),
    ("Here:\n```python\ndef f():\n    return 1\n```\nDone.", "def f():\n    return 1"),
    ("```\nx = 1\n```", "x = 1"),
    ("```python\na = 1\n```\nbetter:\n```py\na = 2\n```", "a = 2"),
    ("```python\na = 1\n```\n```text\nnot code\n```", "a = 1"),
    ("```bash\nls\n```", "ls"),
    ("```python\ndef f():\n    return 1", "def f():\n    return 1"),  # unclosed fence
    ("```python\na = 1\n```\n```python\nb = 2", "b = 2"),  # the last, unclosed block
    ("```python\na = 1\n```\nand ```x``` inline", "a = 1"),
    ("```python\n\n    return x\n```", "    return x"),  # a body keeps its indentation
    # a thinking model's reasoning is not its answer (trial 4: code only in <think> passed; code
    # after a <think> block ran with the tags, a syntax error)
    ("<think>\n```python\ndef f():\n    return 1\n```\n</think>\n\nI am not sure.", "I am not sure."),
    ("<think>\nok\n</think>\n\ndef f():\n    return 1", "def f():\n    return 1"),
    ("<think>plan</think>\n```python\na = 1\n```", "a = 1"),
    ("<think>\nunfinished reasoning with ```python\na = 1", ""),  # unclosed: no answer
])
def test_extract_code(text, code):
    assert extract_code(text) == code


def test_build_program_prepends_prompt_only_for_bodies():
    t = CodeTask("x", "p", "add", ["assert add(1, 2) == 3"], prefix="def add(a, b):\n")
    assert build_program(t, "    return a + b") == "def add(a, b):\n    return a + b"
    assert build_program(t, "def add(a, b):\n    return b + a") == "def add(a, b):\n    return b + a"
    assert build_program(CodeTask("x", "p", "f", ["pass"]), "    x") == "    x"


def test_feedback_message_parts_and_truncation():
    from agentrl.sandbox import SandboxResult

    r = SandboxResult("fail", 1, 3, stdout="A" * 50, stderr="")
    msg = feedback_message(r, "fail", "E" * 30, max_chars=10)
    assert msg == ("Your code failed: EEEEEEE...\nTests passed: 1/3.\nOutput:\n...AAAAAAA\n"
                   "Fix the function and answer with the complete code.")
    assert feedback_message(None, "no_code", "no code found in the answer", 400) == (
        "Your code failed: no code found in the answer\n"
        "Fix the function and answer with the complete code.")


def test_task_time_limit_replaces_env_limits():
    t = task_from_dict({**ADD7, "time_limit": 12.0})
    job = sandbox_job(t, "x = 1", Limits(wall_s=2.0, cpu_s=2.0, memory_mb=256))
    assert (job["limits"].wall_s, job["limits"].cpu_s, job["limits"].memory_mb) == (12.0, 12.0, 256)
    t = task_from_dict({**ADD7, "memory_mb": 1024})
    assert sandbox_job(t, "x = 1", Limits(memory_mb=256))["limits"].memory_mb == 1024
    assert sandbox_job(task_from_dict(ADD7), "x", Limits(wall_s=2.0)).get("limits").wall_s == 2.0


def test_twin_attempts_share_one_verdict_unless_asked_not_to():
    """`cache_verdicts` (default on): the same answer to the same task is judged once per pool;
    the twin's step reads the same and says `cached`; `sandbox/cached` counts such steps."""
    from agentrl.log.steps import rollout_metrics
    from agentrl.sandbox import SandboxPool
    from agentrl.types import Trajectory, Turn

    with SandboxPool(workers=1, backend="auto") as own:
        steps = []
        for cache in (True, True, False):
            env = CodeSandboxEnv(max_turns=2, pool=own, cache_verdicts=cache)
            env.reset(options={"task": ADD7})
            steps.append(env.step(WRONG))
        assert own.cache_hits == 2  # the second env's attempt and its public-test feedback run
        assert [s[4]["cached"] for s in steps] == [False, True, False]
        assert steps[0][:4] == steps[1][:4] == steps[2][:4]  # feedback, reward, flags
        assert {k: v for k, v in steps[0][4].items() if k not in ("cached", "wall_s")} == \
            {k: v for k, v in steps[1][4].items() if k not in ("cached", "wall_s")}
    trajs = [Trajectory(turns=[Turn(start=0, end=0, info=s[4])]) for s in steps]
    assert rollout_metrics(trajs, lambda t: False)["sandbox/cached"] == 1.0


def test_verdicts_are_shared_within_a_reset_seed_only():
    """A group's episodes (one reset seed) share a verdict; a later step's episodes (another
    seed) run the same answer again, so a program that passed by chance is not paid again."""
    from agentrl.sandbox import SandboxPool

    with SandboxPool(workers=1, backend="auto") as own:
        cached = []
        for seed in (11, 11, 12, 12):
            env = CodeSandboxEnv(pool=own)
            env.reset(seed=seed, options={"task": ADD7})
            cached.append(env.step(RIGHT)[4]["cached"])
        assert cached == [False, True, False, True]


def test_bad_constructor_arguments():
    for kw, key in (({"max_turns": 0}, "max_turns"), ({"split": "dev"}, "split"),
                    ({"backend": "chroot"}, "backend"), ({"families": ["graph"]}, "families"),
                    ({"cache_verdicts": "yes"}, "cache_verdicts")):
        with pytest.raises(ValueError, match=key):
            CodeSandboxEnv(**kw)


# -- the built-in family -------------------------------------------------------------------------

def test_generate_tasks_is_deterministic_and_prefix_stable():
    a = code_tasks.generate_tasks("train", 30, 7)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in code_tasks.generate_tasks("train", 30, 7)]
    assert [t.task_id for t in code_tasks.generate_tasks("train", 10, 7)] == [t.task_id for t in a[:10]]
    assert len({t.task_id for t in a}) == 30
    assert [t.task_id for t in a] != [t.task_id for t in code_tasks.generate_tasks("train", 30, 8)]


def test_sample_task_uses_only_the_given_generator():
    a = code_tasks.sample_task(np.random.default_rng(3), "heldout")
    b = code_tasks.sample_task(np.random.default_rng(3), "heldout")
    assert a.to_dict() == b.to_dict() and a.meta["split"] == "heldout"


def test_split_by_key_every_template_trained_and_heldout_unseen():
    train_keys, held_keys = set(), set()
    for tpl in code_tasks.TEMPLATES:
        for p in tpl.param_grid():
            for args in code_tasks.ARG_NAMES[tpl.kind]:
                key = code_tasks.task_key(tpl, p, args)
                (held_keys if code_tasks.key_split(key) == "heldout" else train_keys).add(key)
    assert not train_keys & held_keys
    trained = {k.split("/")[0] for k in train_keys}
    held = {k.split("/")[0] for k in held_keys}
    assert trained == {t.tid for t in code_tasks.TEMPLATES}  # no held-out-only template
    with_params = {t.tid for t in code_tasks.TEMPLATES if t.k or t.c}
    assert with_params <= held  # every parameterised template has held-out combinations
    assert 0.15 < len(held_keys) / (len(held_keys) + len(train_keys)) < 0.25
    for t in code_tasks.generate_tasks("heldout", 200, 0):
        assert t.meta["key"] in held_keys


def test_statements_and_solutions_are_short_and_regular():
    for t in code_tasks.generate_tasks("all", 300, 0):
        assert t.prompt.startswith(f"Write a Python function `{t.entry_point}(")
        assert len(t.prompt.split()) <= 30
        head, body = t.solution.rstrip("\n").split("\n")
        assert head.startswith(f"def {t.entry_point}(") and body.startswith("    return ")
        assert len(t.solution) <= 90 and 4 <= len(t.tests) <= 5


def test_example_statement_and_solution():
    tpl = next(t for t in code_tasks.TEMPLATES if t.tid == "a_muladd")
    t = code_tasks.make_task(tpl, {"k": 3, "j": 2}, "x", "compute")
    assert t.prompt == "Write a Python function `compute(x)` that returns x times 3 plus 2."
    assert t.solution == "def compute(x):\n    return x * 3 + 2\n"
    # expected values by hand: -5*3+2 = -13, 0*3+2 = 2, 3*3+2 = 11, 10*3+2 = 32, 71*3+2 = 215
    assert t.tests == ["assert compute(-5) == -13", "assert compute(0) == 2", "assert compute(3) == 11",
                       "assert compute(10) == 32", "assert compute(71) == 215"]
    tpl = next(t for t in code_tasks.TEMPLATES if t.tid == "s_starts")
    t = code_tasks.make_task(tpl, {"c": "b"}, "s", "solve")
    assert t.prompt == "Write a Python function `solve(s)` that returns whether s starts with 'b'."
    assert t.tests[-2:] == ["assert solve('') == False", "assert solve('bxb') == True"]


def _passes(solution: str, tests: list[str]) -> bool:
    ns: dict = {}
    exec(solution, ns)  # our own generated reference solutions
    try:
        for t in tests:
            exec(t, ns)
    except AssertionError:
        return False
    return True


def test_hidden_tests_tell_parameters_apart():
    """For every template and every two parameter values p != q, the reference of q fails
    the tests of p: a model that copies the wrong number or letter is not rewarded."""
    for tpl in code_tasks.TEMPLATES:
        tasks = [code_tasks.make_task(tpl, p, code_tasks.ARG_NAMES[tpl.kind][0], "f")
                 for p in tpl.param_grid()]
        for a in tasks:
            assert _passes(a.solution, a.tests)
            for b in tasks:
                if b is not a:
                    assert not _passes(b.solution, a.tests), (tpl.tid, a.meta["params"], b.meta["params"])


def test_corpus_texts():
    texts = code_tasks.corpus_texts(20)
    assert len(texts) == 40 and texts[1].startswith("def ")


# -- toy env -------------------------------------------------------------------------------------

def test_toy_env():
    env = make_env("toy")
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    target = env.unwrapped.target
    assert obs == [{"role": "user", "content": f"Say the word {target}."}]
    assert env.step(f"OK: {target.upper()}!")[1:4] == (1.0, True, False)
    env.reset(seed=0)
    assert env.step("something else")[1] == 0.0
    assert ToyEnv().reset(seed=1)[1] == ToyEnv().reset(seed=1)[1]
