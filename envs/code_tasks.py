"""The built-in coding problems: a procedural family of one-line Python functions.

Every problem reads "Write a Python function `NAME(ARGS)` that returns PHRASE." and is solved by
`def NAME(ARGS):\\n    return EXPR`, where PHRASE -> EXPR is a fixed, regular mapping
("x times 3 plus 2" -> `x * 3 + 2`, "the elements of xs greater than 4" ->
`[v for v in xs if v > 4]`). It is made for a tiny model warm-started on the reference
solutions: statements are short (<= ~25 words), solutions short (<= ~30 BPE tokens).

Families: `arith` (ints), `string`, `list` (lists of ints), `dict` (str -> int). Level 1 is one
operation; level 2 composes two ("x times 3 plus 2", "the sum of the elements of xs greater
than 4"). Hidden tests are 4-5 asserts on fixed inputs, with expected values computed from the
reference solution.

Split: a task's *key* is (template, parameters, argument names); `heldout` holds the keys with
`split_fraction(key) < HELDOUT_FRACTION`, `train` the rest. Held-out tasks therefore use
parameter/argument combinations never seen in training, with the same templates (every
template has keys in both splits). The function name is not part of the key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentrl_envs.code_datasets import CodeTask, normalize_split, split_fraction

HELDOUT_FRACTION = 0.2
FAMILIES = ("arith", "string", "list", "dict")
LEVELS = (1, 2)

#: Function names the statements use.
FUNCTION_NAMES = ("solve", "compute", "transform", "process", "answer", "calc", "func", "helper")
#: Argument names by kind (`int2` is a pair of ints).
ARG_NAMES = {
    "int": ("x", "n", "a", "num"),
    "int2": ("a, b", "x, y", "m, n", "p, q"),
    "str": ("s", "text", "word", "name"),
    "list": ("xs", "nums", "values", "items"),
    "dict": ("d", "counts", "scores", "table"),
}
#: Fixed test inputs by kind (each task asserts its reference's output on all of them). They
#: tell every two parameter values of a template apart (tests/test_code_sandbox_env.py); string
#: tasks with a letter parameter `c` replace the last input by `PROBE` (e.g. "axa" for 'a').
TEST_INPUTS: dict[str, list[tuple]] = {
    "int": [(-5,), (0,), (3,), (10,), (71,)],
    "int2": [(2, 3), (-1, 4), (0, 5), (7, 7), (10, -3)],
    "str": [("hello",), ("banana",), ("bottle",), ("",), ("Table",)],
    "list": [([3, 1, 4, 1, 5],), ([10, -2, 7],), ([2, 8, 6, 4],), ([5],),
             ([9, 0, 9, 3, 12, 6, 6, 2],)],
    "dict": [({"a": 3, "b": 7, "e": 1},), ({"t": 5, "b": 2},), ({"l": 9, "a": 0, "n": 4},),
             ({"o": 6},), ({"n": 8, "e": 5},)],
}
LETTERS = "abelnot"  # letters of string/dict parameters (all occur in the test inputs)
PROBE = "{c}x{c}"


@dataclass(frozen=True)
class Template:
    """One problem shape: `phrase` and `expr` are format strings over the argument names
    (`a`, `b`) and parameters (`k`, `j`: ints, `c`, `e`: letters)."""

    tid: str
    family: str
    level: int
    kind: str
    phrase: str
    expr: str
    k: tuple[int, int] | None = None  # inclusive range of k
    j: tuple[int, int] | None = None
    c: bool = False
    e: bool = False

    def param_grid(self) -> list[dict[str, object]]:
        """Every parameter combination (a list of dicts; `[{}]` when there are none)."""
        grid: list[dict[str, object]] = [{}]
        for name, rng in (("k", self.k), ("j", self.j)):
            if rng is not None:
                grid = [{**g, name: v} for g in grid for v in range(rng[0], rng[1] + 1)]
        for name, on in (("c", self.c), ("e", self.e)):
            if on:
                grid = [{**g, name: ch} for g in grid for ch in LETTERS if ch != g.get("c")]
        return grid


def _t(tid, family, level, kind, phrase, expr, **kw) -> Template:
    return Template(tid, family, level, kind, phrase, expr, **kw)


K9, K29 = (1, 9), (2, 9)
# fmt: off
TEMPLATES: tuple[Template, ...] = (
    # -- arith, level 1
    _t("a_add", "arith", 1, "int", "{a} plus {k}", "{a} + {k}", k=K9),
    _t("a_sub", "arith", 1, "int", "{a} minus {k}", "{a} - {k}", k=K9),
    _t("a_mul", "arith", 1, "int", "{a} times {k}", "{a} * {k}", k=K29),
    _t("a_mod", "arith", 1, "int", "{a} modulo {k}", "{a} % {k}", k=K29),
    _t("a_div", "arith", 1, "int", "{a} divided by {k}, rounded down", "{a} // {k}", k=K29),
    _t("a_pow", "arith", 1, "int", "{a} to the power {k}", "{a} ** {k}", k=(2, 4)),
    _t("a_rsub", "arith", 1, "int", "{k} minus {a}", "{k} - {a}", k=K9),
    _t("a_max", "arith", 1, "int", "the larger of {a} and {k}", "max({a}, {k})", k=K9),
    _t("a_min", "arith", 1, "int", "the smaller of {a} and {k}", "min({a}, {k})", k=K9),
    _t("a_abs", "arith", 1, "int", "the absolute value of {a}", "abs({a})"),
    _t("a2_add", "arith", 1, "int2", "{a} plus {b}", "{a} + {b}"),
    _t("a2_mul", "arith", 1, "int2", "{a} times {b}", "{a} * {b}"),
    _t("a2_max", "arith", 1, "int2", "the larger of {a} and {b}", "max({a}, {b})"),
    # -- arith, level 2
    _t("a_muladd", "arith", 2, "int", "{a} times {k} plus {j}", "{a} * {k} + {j}", k=K29, j=K9),
    _t("a_mulsub", "arith", 2, "int", "{a} times {k} minus {j}", "{a} * {k} - {j}", k=K29, j=K9),
    _t("a_modadd", "arith", 2, "int", "{a} modulo {k} plus {j}", "{a} % {k} + {j}", k=K29, j=K9),
    _t("a_powadd", "arith", 2, "int", "{a} to the power {k} plus {j}", "{a} ** {k} + {j}", k=(2, 3), j=K9),
    _t("a_maxadd", "arith", 2, "int", "the larger of {a} and {k} plus {j}", "max({a}, {k}) + {j}", k=K9, j=K9),
    _t("a2_muladd", "arith", 2, "int2", "{a} times {b} plus {k}", "{a} * {b} + {k}", k=K9),
    # -- string, level 1
    _t("s_upper", "string", 1, "str", "{a} in upper case", "{a}.upper()"),
    _t("s_lower", "string", 1, "str", "{a} in lower case", "{a}.lower()"),
    _t("s_rev", "string", 1, "str", "{a} reversed", "{a}[::-1]"),
    _t("s_len", "string", 1, "str", "the length of {a}", "len({a})"),
    _t("s_rep", "string", 1, "str", "{a} repeated {k} times", "{a} * {k}", k=(2, 5)),
    _t("s_head", "string", 1, "str", "the first {k} characters of {a}", "{a}[:{k}]", k=(1, 6)),
    _t("s_tail", "string", 1, "str", "the last {k} characters of {a}", "{a}[-{k}:]", k=(1, 6)),
    _t("s_count", "string", 1, "str", "the number of times '{c}' occurs in {a}", "{a}.count('{c}')", c=True),
    _t("s_replace", "string", 1, "str", "{a} with every '{c}' replaced by '{e}'", "{a}.replace('{c}', '{e}')", c=True, e=True),
    _t("s_starts", "string", 1, "str", "whether {a} starts with '{c}'", "{a}.startswith('{c}')", c=True),
    _t("s_ends", "string", 1, "str", "whether {a} ends with '{c}'", "{a}.endswith('{c}')", c=True),
    _t("s_append", "string", 1, "str", "{a} followed by '{c}'", "{a} + '{c}'", c=True),
    # -- string, level 2
    _t("s_rev_upper", "string", 2, "str", "{a} reversed in upper case", "{a}[::-1].upper()"),
    _t("s_head_upper", "string", 2, "str", "the first {k} characters of {a} in upper case", "{a}[:{k}].upper()", k=(1, 6)),
    _t("s_len_add", "string", 2, "str", "the length of {a} plus {k}", "len({a}) + {k}", k=K9),
    _t("s_len_mul", "string", 2, "str", "the length of {a} times {k}", "len({a}) * {k}", k=K29),
    _t("s_replace_upper", "string", 2, "str", "{a} with every '{c}' replaced by '{e}' in upper case", "{a}.replace('{c}', '{e}').upper()", c=True, e=True),
    _t("s_tail_rep", "string", 2, "str", "the last {k} characters of {a} repeated {j} times", "{a}[-{k}:] * {j}", k=(1, 6), j=(2, 4)),
    # -- list, level 1
    _t("l_sum", "list", 1, "list", "the sum of {a}", "sum({a})"),
    _t("l_max", "list", 1, "list", "the largest element of {a}", "max({a})"),
    _t("l_min", "list", 1, "list", "the smallest element of {a}", "min({a})"),
    _t("l_len", "list", 1, "list", "the number of elements in {a}", "len({a})"),
    _t("l_sort", "list", 1, "list", "{a} sorted in ascending order", "sorted({a})"),
    _t("l_sortd", "list", 1, "list", "{a} sorted in descending order", "sorted({a}, reverse=True)"),
    _t("l_rev", "list", 1, "list", "{a} reversed", "{a}[::-1]"),
    _t("l_head", "list", 1, "list", "the first {k} elements of {a}", "{a}[:{k}]", k=(1, 6)),
    _t("l_tail", "list", 1, "list", "the last {k} elements of {a}", "{a}[-{k}:]", k=(1, 6)),
    _t("l_add", "list", 1, "list", "each element of {a} plus {k}", "[v + {k} for v in {a}]", k=K9),
    _t("l_mul", "list", 1, "list", "each element of {a} times {k}", "[v * {k} for v in {a}]", k=K29),
    _t("l_gt", "list", 1, "list", "the elements of {a} greater than {k}", "[v for v in {a} if v > {k}]", k=K9),
    _t("l_lt", "list", 1, "list", "the elements of {a} less than {k}", "[v for v in {a} if v < {k}]", k=K9),
    _t("l_count", "list", 1, "list", "the number of times {k} occurs in {a}", "{a}.count({k})", k=K9),
    _t("l_even", "list", 1, "list", "the even elements of {a}", "[v for v in {a} if v % 2 == 0]"),
    # -- list, level 2
    _t("l_muladd", "list", 2, "list", "each element of {a} times {k} plus {j}", "[v * {k} + {j} for v in {a}]", k=K29, j=K9),
    _t("l_sum_gt", "list", 2, "list", "the sum of the elements of {a} greater than {k}", "sum([v for v in {a} if v > {k}])", k=K9),
    _t("l_len_gt", "list", 2, "list", "the number of elements of {a} greater than {k}", "len([v for v in {a} if v > {k}])", k=K9),
    _t("l_max_add", "list", 2, "list", "the largest element of {a} plus {k}", "max({a}) + {k}", k=K9),
    _t("l_sum_mul", "list", 2, "list", "the sum of {a} times {k}", "sum({a}) * {k}", k=K29),
    _t("l_top", "list", 2, "list", "the {k} largest elements of {a} in descending order", "sorted({a}, reverse=True)[:{k}]", k=(1, 4)),
    _t("l_gt_add", "list", 2, "list", "the elements of {a} greater than {k}, each plus {j}", "[v + {j} for v in {a} if v > {k}]", k=K9, j=K9),
    # -- dict, level 1
    _t("d_keys", "dict", 1, "dict", "the keys of {a} in sorted order", "sorted({a})"),
    _t("d_sum", "dict", 1, "dict", "the sum of the values of {a}", "sum({a}.values())"),
    _t("d_len", "dict", 1, "dict", "the number of keys in {a}", "len({a})"),
    _t("d_get", "dict", 1, "dict", "the value of key '{c}' in {a}, or {k} if it is missing", "{a}.get('{c}', {k})", k=K9, c=True),
    _t("d_has", "dict", 1, "dict", "whether '{c}' is a key of {a}", "'{c}' in {a}", c=True),
    _t("d_max", "dict", 1, "dict", "the largest value of {a}", "max({a}.values())"),
    _t("d_argmax", "dict", 1, "dict", "the key of {a} with the largest value", "max({a}, key={a}.get)"),
    _t("d_add", "dict", 1, "dict", "{a} with each value plus {k}", "{{key: v + {k} for key, v in {a}.items()}}", k=K9),
    _t("d_mul", "dict", 1, "dict", "{a} with each value times {k}", "{{key: v * {k} for key, v in {a}.items()}}", k=K29),
    # -- dict, level 2
    _t("d_muladd", "dict", 2, "dict", "{a} with each value times {k} plus {j}", "{{key: v * {k} + {j} for key, v in {a}.items()}}", k=K29, j=K9),
    _t("d_keys_gt", "dict", 2, "dict", "the sorted keys of {a} with a value greater than {k}", "sorted([key for key, v in {a}.items() if v > {k}])", k=K9),
    _t("d_sum_add", "dict", 2, "dict", "the sum of the values of {a} plus {k}", "sum({a}.values()) + {k}", k=K9),
)
# fmt: on
_BY_GROUP: dict[tuple[str, int], list[Template]] = {}
for _tpl in TEMPLATES:
    _BY_GROUP.setdefault((_tpl.family, _tpl.level), []).append(_tpl)

STATEMENT = "Write a Python function `{name}({args})` that returns {phrase}."


def task_key(tpl: Template, params: dict[str, object], args: str) -> str:
    """The split key of a task: template, parameters and argument names (not the function name)."""
    ps = ",".join(f"{k}={params[k]}" for k in sorted(params))
    return f"{tpl.tid}/{ps}/{args.replace(', ', ',')}"


def key_split(key: str) -> str:
    """`heldout` or `train` for a task key (fixed: SHA-256 of the key, `HELDOUT_FRACTION`)."""
    return "heldout" if split_fraction(key) < HELDOUT_FRACTION else "train"


def make_task(tpl: Template, params: dict[str, object], args: str, name: str) -> CodeTask:
    """Build one task: statement, reference solution and its hidden asserts.

    The expected values are computed by running the reference solution here (it is our own
    one-line code, never the agent's).
    """
    names = [a.strip() for a in args.split(",")]
    fmt = {"a": names[0], "b": names[-1], **params}
    expr = tpl.expr.format(**fmt)
    solution = f"def {name}({args}):\n    return {expr}\n"
    ns: dict[str, object] = {}
    exec(solution, ns)  # noqa: S102 - our own generated reference
    fn = ns[name]
    tests = []
    inputs: list[tuple] = list(TEST_INPUTS[tpl.kind])
    if tpl.kind == "str" and tpl.c:
        inputs = inputs[:-1] + [(PROBE.format(c=params["c"]),)]
    for inp in inputs:
        out = fn(*[_copy(x) for x in inp])  # type: ignore[operator]
        call = ", ".join(repr(x) for x in inp)
        tests.append(f"assert {name}({call}) == {out!r}")
    key = task_key(tpl, params, args)
    return CodeTask(
        task_id=f"gen/{key}/{name}",
        prompt=STATEMENT.format(name=name, args=args, phrase=tpl.phrase.format(**fmt)),
        entry_point=name, tests=tests, solution=solution, source="builtin",
        meta={"family": tpl.family, "level": tpl.level, "template": tpl.tid, "params": dict(params),
              "args": args, "key": key, "split": key_split(key)})


def _copy(x):
    return {k: v for k, v in x.items()} if isinstance(x, dict) else list(x) if isinstance(x, list) else x


def template_groups(families=None, levels=None) -> list[tuple[str, int]]:
    """The (family, level) groups of templates to draw from (None: all).

    Raises:
        ValueError: an unknown family or level, or no templates left.
    """
    fams = tuple(families) if families is not None else FAMILIES
    levs = tuple(levels) if levels is not None else LEVELS
    bad = [f for f in fams if f not in FAMILIES] + [str(lv) for lv in levs if lv not in LEVELS]
    if bad:
        raise ValueError(f"code_tasks: unknown families/levels {bad}; families: {', '.join(FAMILIES)}; "
                         f"levels: {', '.join(map(str, LEVELS))}")
    groups = [(f, lv) for f in fams for lv in levs if (f, lv) in _BY_GROUP]
    if not groups:
        raise ValueError("code_tasks: no templates for the chosen families and levels")
    return groups


def sample_task(rng: np.random.Generator, split: str = "train", *, families=None,
                levels=None) -> CodeTask:
    """Draw one task of `split` (`train`, `heldout`, or `all`) using only `rng`.

    A family and a level are drawn uniformly, then a template, its parameters, argument names
    and function name; draws whose key falls in the other split are redrawn (so the result is a
    deterministic function of the generator's state).

    Raises:
        ValueError: unknown split, family or level.
    """
    split = normalize_split(split)
    groups = template_groups(families, levels)
    while True:
        fam, lev = groups[int(rng.integers(len(groups)))]
        tpls = _BY_GROUP[(fam, lev)]
        tpl = tpls[int(rng.integers(len(tpls)))]
        grid = tpl.param_grid()
        params = grid[int(rng.integers(len(grid)))]
        argset = ARG_NAMES[tpl.kind]
        args = argset[int(rng.integers(len(argset)))]
        name = FUNCTION_NAMES[int(rng.integers(len(FUNCTION_NAMES)))]
        if split == "all" or key_split(task_key(tpl, params, args)) == split:
            return make_task(tpl, params, args, name)


def generate_tasks(split: str = "train", n: int = 100, seed: int = 0, *, families=None,
                   levels=None) -> list[CodeTask]:
    """`n` distinct tasks of `split`, deterministic in `(split, n, seed)`; the first `m` tasks
    of a call with `n > m` are the tasks of the call with `m`.

    Raises:
        ValueError: unknown split/family/level, or `n` larger than the number of distinct tasks.
    """
    rng = np.random.default_rng(seed)
    out: list[CodeTask] = []
    seen: set[str] = set()
    misses = 0
    while len(out) < n:
        t = sample_task(rng, split, families=families, levels=levels)
        if t.task_id in seen:
            misses += 1
            if misses > 100 * n + 1000:
                raise ValueError(f"generate_tasks: could not find {n} distinct {split} tasks")
            continue
        seen.add(t.task_id)
        out.append(t)
    return out


def corpus_texts(n: int = 1000, seed: int = 0) -> list[str]:
    """Texts for training a tokenizer: the statement and the reference solution of `n` train
    tasks (2n strings)."""
    texts = []
    for t in generate_tasks("train", n, seed):
        texts += [t.prompt, t.solution]
    return texts
