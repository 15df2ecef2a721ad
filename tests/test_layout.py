"""The package layout: no import cycles between modules of agentrl/, envs/ and tools/, and no
arrow the layout forbids (rollout never reaches into training, evaluation never into the
training loop, the learner never into the rollout engine).

Imports are read with `ast` from the source files, every one of them: module level, inside
functions and under `if TYPE_CHECKING:` alike, so that a lazy import cannot hide a cycle.

By folder (a module's folder is its first package level under agentrl/, e.g. `agentrl.learner`;
a top-level module is its own folder; envs/ and tools/ are one folder each): no cycles, and no
arrow of `FOLDER_RULES`. Today's offending folder edges are listed in `KNOWN`, each with who
removes it; the tests subtract them, and fail when one is gone (so the list only shrinks).
In-tree imports inside functions are allowed only for the reasons of `LAZY_IN_TREE`, at most `LAZY_IN_TREE_MAX`. The
measured figures are printed (`pytest -rA tests/test_layout.py`; benchmarks/layout_report.py).
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"agentrl": ROOT / "agentrl", "agentrl_envs": ROOT / "envs", "agentrl_tools": ROOT / "tools"}

FORBIDDEN = [  # (importer prefix, imported prefix): an arrow no module may draw
    ("agentrl.algos", "agentrl.rollout"),
    ("agentrl.algos", "agentrl_envs"),
    ("agentrl.rollout", "agentrl.train"),
    ("agentrl.rollout", "agentrl.learner"),
    ("agentrl.eval", "agentrl.train"),
    ("agentrl.learner", "agentrl.rollout"),
    ("agentrl.models", "agentrl.rollout"),
    ("agentrl.models", "agentrl.learner"),
    ("agentrl.models", "agentrl.train"),
    ("agentrl_envs", "agentrl.train"),
    ("agentrl_tools", "agentrl.train"),
]


IN_TREE = tuple(PACKAGES)
FOLDER_RULES = [  # (importer folder, imported folder prefix): an arrow no folder may draw,
    # lazy imports counted; "*" is every in-tree folder but agentrl.types (plain data)
    *[("agentrl.types", p) for p in IN_TREE],
    ("agentrl.config", "*"),
    ("agentrl.algos", "agentrl.learner"), ("agentrl.algos", "agentrl.rollout"),
    ("agentrl.algos", "agentrl.run"),
    ("agentrl.learner", "agentrl.algos"), ("agentrl.learner", "agentrl.rollout"),
    ("agentrl.env", "agentrl.rewards"), ("agentrl.env", "agentrl.config"), ("agentrl.env", "agentrl.run"),
    ("agentrl.eval", "agentrl.train"),
]

CONFIG_SCHEMAS = {"agentrl.algos.configs", "agentrl.yaml_safe", "agentrl.config.overrides"}
"""Modules of plain config schemas (pydantic classes, no torch, no runtime module) that
`agentrl.config` may import: each algorithm's config class lives with the algorithms, and the
config's union of them is built from it; `agentrl.yaml_safe` is the YAML reader (PyYAML only);
`agentrl.config.overrides` reads the YAML file and the overrides into a dict and formats the
errors (split from `agentrl.config`). They import nothing in-tree but `agentrl.types` and each
other (`test_config_schemas_import_nothing_at_runtime`)."""

KNOWN: dict[str, str] = {}  # today's offending folder edges (a forbidden arrow or one closing a cycle) -> who removes it

LAZY_IN_TREE = {
    "agentrl.cli": "the entry point: each command imports its runtime (torch) only when it runs, "
                   "so `--help`, argument and config errors come before the heavy imports",
    "agentrl.rollout.engines.vllm_vision": "vLLM, an optional dependency",
    "agentrl.rollout.engines.vllm": "vLLM, an optional dependency",
    "agentrl_envs": "agentrl imports envs/ only when a user makes an env",
}
"""The only in-tree imports allowed inside functions of agentrl/: made BY the entry point
(`agentrl.cli`), or OF a module that pulls an optional heavy dependency or the env package.
Everything else imports at module level. At most `LAZY_IN_TREE_MAX` in all."""

LAZY_IN_TREE_MAX = 25

HEAVY_OPTIONAL = {"vllm", "ray", "peft", "matplotlib", "wandb", "tensorboard", "transformers", "docker"}
"""Third-party packages a function may import lazily (heavy or optional); other lazy
third-party imports are counted and printed."""


def module_files() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the three packages."""
    mods = {}
    for pkg, root in PACKAGES.items():
        for f in sorted(root.rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg, *parts])] = f
    return mods


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


class Import(NamedTuple):
    """One imported name: `importer` (a module of `mods`), `target` (a module of `mods`, or a
    third-party top-level package name), `lazy` (inside a function), `line`, `in_tree`."""

    importer: str
    target: str
    lazy: bool
    line: int
    in_tree: bool


def _walk(node: ast.AST, lazy: bool = False):
    """(node, inside a function) for every node under `node`."""
    for child in ast.iter_child_nodes(node):
        yield child, lazy
        yield from _walk(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                              ast.Lambda)))


def all_imports(mods: dict[str, Path]) -> list[Import]:
    """Every import of the modules of `mods`, one `Import` per imported module; `from a import
    b` points at the module `a.b` when it is one, else at `a`. An import of the importer itself
    is left out; relative imports are resolved."""
    out = []
    for name, f in mods.items():
        is_pkg = f.name == "__init__.py"
        for node, lazy in _walk(ast.parse(f.read_text(), str(f))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_pkg else name.split(".")[:-1]
                    here = here[:len(here) - (node.level - 1)]
                    base = ".".join(here + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in dict.fromkeys(targets):
                resolved = t
                while resolved and resolved not in mods:  # `import a.b.c` of a name inside a module
                    resolved = resolved.rpartition(".")[0]
                if resolved:
                    if resolved != name:
                        out.append(Import(name, resolved, lazy, node.lineno, True))
                elif t:
                    out.append(Import(name, t.split(".")[0], lazy, node.lineno, False))
    return out


@functools.cache
def project_imports() -> tuple[Import, ...]:
    """`all_imports` of the three packages, read once per test process."""
    return tuple(all_imports(module_files()))


def project_edges() -> set[tuple[str, str]]:
    """The in-tree (importer, imported) module pairs of the three packages."""
    return {(i.importer, i.target) for i in project_imports() if i.in_tree}


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def forbidden(edges: set[tuple[str, str]]) -> list[str]:
    """The edges that draw a forbidden arrow, as `importer -> imported` lines."""
    return sorted(f"{a} -> {b}" for a, b in edges
                  for pa, pb in FORBIDDEN if _under(a, pa) and _under(b, pb))


def test_no_import_cycles():
    edges = project_edges()
    found = cycles(edges)
    detail = ["  " + " <-> ".join(c) + ": " + ", ".join(f"{a} -> {b}" for a, b in sorted(edges)
                                                       if a in c and b in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(detail)


def test_no_forbidden_arrows():
    bad = forbidden(project_edges())
    assert not bad, "imports the layout forbids:\n  " + "\n  ".join(bad)


def test_the_checker_sees_cycles_and_arrows():
    """The checker itself: a made-up cycle and a forbidden arrow are reported."""
    edges = {("agentrl.a", "agentrl.b"), ("agentrl.b", "agentrl.a"), ("agentrl.b", "agentrl.c"),
             ("agentrl.rollout.x", "agentrl.train")}
    assert cycles(edges) == [["agentrl.a", "agentrl.b"]]
    assert forbidden(edges) == ["agentrl.rollout.x -> agentrl.train"]
    assert ("agentrl.run", "agentrl.rollout.workers") in project_edges()


# -- by folder -----------------------------------------------------------------------------------
def folder(module: str) -> str:
    """`agentrl.learner.local` -> `agentrl.learner`; `agentrl.train` -> itself; a module of
    envs/ or tools/ -> its package (`agentrl_envs`, `agentrl_tools`)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "agentrl" else parts[0]


def folder_edges(imports: list[Import]) -> dict[str, list[str]]:
    """`folder -> folder` (different folders) -> the module imports behind it, as
    `importer:line -> imported` strings."""
    out: dict[str, list[str]] = {}
    for i in imports:
        a, b = folder(i.importer), folder(i.target)
        if (i.importer == "agentrl.config" or i.importer.startswith("agentrl.config.")) and i.target in CONFIG_SCHEMAS:
            continue  # schemas, not runtime (CONFIG_SCHEMAS)
        if i.in_tree and a != b:
            out.setdefault(f"{a} -> {b}", []).append(f"{i.importer}:{i.line} -> {i.target}")
    return out


def _pair(edge: str) -> tuple[str, str]:
    a, _, b = edge.partition(" -> ")
    return a, b


def forbidden_folder_edges(edges: dict[str, list[str]]) -> list[str]:
    """The folder edges that draw an arrow of `FOLDER_RULES`, sorted."""
    bad = []
    for e in edges:
        a, b = _pair(e)
        if any(_under(a, ra) and (_under(b, rb) if rb != "*" else b != "agentrl.types")
               for ra, rb in FOLDER_RULES):
            bad.append(e)
    return sorted(bad)


def folder_cycles(edges: dict[str, list[str]], drop: set[str] = frozenset()) -> list[list[str]]:
    """Strongly connected groups of folders over `edges` without those in `drop`."""
    return cycles({_pair(e) for e in edges if e not in drop})


def _detail(edges: dict[str, list[str]], names: list[str]) -> str:
    return "\n".join(f"  {e}: {', '.join(edges[e][:6])}" for e in names)


def layout_counts() -> dict[str, object]:
    """The measured figures: lazy imports (in-tree, of agentrl/; third-party outside
    `HEAVY_OPTIONAL`), folder cycles with and without `KNOWN`, forbidden folder edges."""
    imports = list(project_imports())
    edges = folder_edges(imports)
    lazy = [i for i in imports if i.lazy and _under(i.importer, "agentrl")]
    other = [i for i in lazy if not i.in_tree and i.target not in HEAVY_OPTIONAL]
    return {"lazy_in_tree": sum(i.in_tree for i in lazy),
            "lazy_third_party_not_allowed": len(other),
            "module_cycles": cycles(project_edges()),
            "folder_cycles": folder_cycles(edges),
            "folder_cycles_without_known": folder_cycles(edges, set(KNOWN)),
            "forbidden_folder_edges": forbidden_folder_edges(edges)}


def test_no_folder_cycles():
    edges = folder_edges(list(project_imports()))
    found = folder_cycles(edges, set(KNOWN))
    print(f"folder cycles (lazy imports counted): {len(folder_cycles(edges))} with the KNOWN edges "
          f"{folder_cycles(edges)}, {len(found)} without")
    names = [e for e in sorted(edges) if any(set(_pair(e)) <= set(c) for c in found)]
    assert not found, "import cycles between folders:\n" + _detail(edges, names)


def test_no_forbidden_folder_arrows():
    edges = folder_edges(list(project_imports()))
    bad = [e for e in forbidden_folder_edges(edges) if e not in KNOWN]
    print(f"forbidden folder edges: {forbidden_folder_edges(edges)} ({len(bad)} not KNOWN)")
    assert not bad, "folder imports the layout forbids:\n" + _detail(edges, bad)


def test_known_edges_still_offend():
    """Every KNOWN edge still exists and still offends (forbidden, or closing a folder cycle):
    when a helper removes one, its entry goes, so the list only shrinks."""
    edges = folder_edges(list(project_imports()))
    in_cycle = {e for e in edges if any(set(_pair(e)) <= set(c) for c in folder_cycles(edges))}
    gone = [e for e in KNOWN if e not in edges or (e not in forbidden_folder_edges(edges)
                                                  and e not in in_cycle)]
    assert not gone, f"KNOWN edges no longer offending: remove them from KNOWN: {gone}"


def test_config_schemas_import_nothing_at_runtime():
    """The schema modules `agentrl.config` may import (`CONFIG_SCHEMAS`) import nothing in-tree
    but `agentrl.types`, and reading a config in a fresh process loads no torch and no runtime
    module of agentrl (the CLI validates a config before the heavy imports)."""
    bad = [f"{i.importer}:{i.line} -> {i.target}" for i in project_imports()
           if i.importer in CONFIG_SCHEMAS and i.in_tree and i.target not in ("agentrl.types", *CONFIG_SCHEMAS)]
    assert not bad, "config schemas import runtime modules:\n  " + "\n  ".join(bad)
    code = ("import sys, agentrl.config as c; c.load_config(overrides=['algo.name=ppo']); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('agentrl.', 'torch.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = ast.literal_eval(out.strip())
    allowed = {"agentrl.config", "agentrl.types", "agentrl.algos", *CONFIG_SCHEMAS,
               # `import agentrl` registers the built-in envs (by string entry point, no torch)
               "agentrl.env", "agentrl.env.base", "agentrl.env.content", "agentrl.env.registry"}
    assert "torch" not in loaded and set(loaded) <= allowed, f"reading a config loaded {sorted(set(loaded) - allowed)}"


def test_lazy_in_tree_imports_only_shrink():
    imports = [i for i in list(project_imports())
               if i.lazy and _under(i.importer, "agentrl")]
    in_tree = [i for i in imports if i.in_tree]
    other = sorted({i.target for i in imports if not i.in_tree and i.target not in HEAVY_OPTIONAL})
    print(f"in-tree imports inside functions of agentrl/: {len(in_tree)} (at most {LAZY_IN_TREE_MAX}); lazy third-party imports outside HEAVY_OPTIONAL: "
          f"{sum(not i.in_tree and i.target not in HEAVY_OPTIONAL for i in imports)} ({', '.join(other)})")
    assert len(in_tree) <= LAZY_IN_TREE_MAX, (
        f"{len(in_tree)} in-tree imports inside functions (at most {LAZY_IN_TREE_MAX}): put new "
        "ones at module level")
    bad = [f"{i.importer}:{i.line} -> {i.target}" for i in in_tree
           if not any(_under(i.importer, k) or _under(i.target, k) for k in LAZY_IN_TREE)]
    assert not bad, ("in-tree imports inside functions that no LAZY_IN_TREE reason covers (move "
                     "them to module level):\n  " + "\n  ".join(bad))


def test_the_folder_checker_sees_cycles_and_arrows():
    imps = [Import("agentrl.learner.local", "agentrl.algos.losses", True, 3, True),
            Import("agentrl.algos.distill", "agentrl.learner.frozen", False, 5, True),
            Import("agentrl.config", "agentrl.types", False, 1, True),
            Import("agentrl.types", "numpy", False, 1, False)]
    edges = folder_edges(imps)
    assert edges["agentrl.learner -> agentrl.algos"] == ["agentrl.learner.local:3 -> agentrl.algos.losses"]
    assert folder_cycles(edges) == [["agentrl.algos", "agentrl.learner"]]
    assert folder_cycles(edges, {"agentrl.learner -> agentrl.algos"}) == []
    assert forbidden_folder_edges(edges) == ["agentrl.algos -> agentrl.learner",
                                             "agentrl.learner -> agentrl.algos"]
    assert folder("agentrl.train") == "agentrl.train" and folder("agentrl_envs.toy.env") == "agentrl_envs"


LONG_MODULES = {
    "agentrl/sandbox/_server.py": "the sandbox's runner: one stand-alone file copied into each sandbox "
                                  "(it imports nothing in-tree)",
}
"""Modules allowed over `MAX_MODULE_LINES` (STYLE.md: small modules), each with why; the list
only shrinks (`test_modules_stay_small` fails when one is back under the limit)."""
MAX_MODULE_LINES = 600


def test_modules_stay_small():
    """No module of agentrl/, envs/ or tools/ over 600 lines but those of `LONG_MODULES`
    (envs/code_datasets.py was 687: split into the record formats and files, and
    envs/code_evalplus.py, EvalPlus's diff tests)."""
    long = {}
    for root in ("agentrl", "envs", "tools"):
        for p in (ROOT / root).rglob("*.py"):
            n = len(p.read_text().splitlines())
            if n > MAX_MODULE_LINES:
                long[str(p.relative_to(ROOT))] = n
    over = {k: n for k, n in long.items() if k not in LONG_MODULES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over} (split them by concern)"
    back = sorted(set(LONG_MODULES) - set(long))
    assert not back, f"{back} are back under {MAX_MODULE_LINES} lines: remove them from LONG_MODULES"


def test_python_source_is_parsed_under_the_one_lock():
    """Every parse of Python source in the trainer's process goes through `agentrl.infra.pyast.parse`
    (one process-wide lock): CPython 3.11 before 3.11.8 raises a spurious `SystemError: AST
    constructor recursion depth mismatch` when two threads run `ast.parse` at once (gh-106905),
    and a lock taken by only some callers does not prevent it."""
    bare = re.compile(r"\bast\.parse\(|PyCF_ONLY_AST")
    offenders = [f"{p.relative_to(ROOT)}:{i}" for d in ("agentrl", "envs", "tools")
                 for p in sorted((ROOT / d).rglob("*.py")) if p != ROOT / "agentrl" / "infra" / "pyast.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1)
                 if bare.search(line) and not line.lstrip().startswith("#")]
    assert offenders == []
    assert bare.search("tree = ast.parse(src)")  # the pattern sees a bare call
