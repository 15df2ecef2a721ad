"""The package layout: no import cycles between modules of agentrl/, envs/ and tools/, and no
arrow the layout forbids (rollout never reaches into training, evaluation never into the
training loop, the learner never into the rollout engine).

Imports are read with `ast` from the source files, every one of them: module level, inside
functions and under `if TYPE_CHECKING:` alike, so that a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

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


def import_edges(mods: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) pairs between modules of `mods`; `from a import b` points at the
    module `a.b` when it is one, else at `a`."""
    edges = set()
    for name, f in mods.items():
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
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
            for t in targets:
                while t and t not in mods:  # `import a.b.c` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges.add((name, t))
    return edges


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
    edges = import_edges(module_files())
    found = cycles(edges)
    detail = ["  " + " <-> ".join(c) + ": " + ", ".join(f"{a} -> {b}" for a, b in sorted(edges)
                                                       if a in c and b in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(detail)


def test_no_forbidden_arrows():
    bad = forbidden(import_edges(module_files()))
    assert not bad, "imports the layout forbids:\n  " + "\n  ".join(bad)


def test_the_checker_sees_cycles_and_arrows():
    """The checker itself: a made-up cycle and a forbidden arrow are reported."""
    edges = {("agentrl.a", "agentrl.b"), ("agentrl.b", "agentrl.a"), ("agentrl.b", "agentrl.c"),
             ("agentrl.rollout.x", "agentrl.train")}
    assert cycles(edges) == [["agentrl.a", "agentrl.b"]]
    assert forbidden(edges) == ["agentrl.rollout.x -> agentrl.train"]
    assert ("agentrl.run", "agentrl.rollout.workers") in import_edges(module_files())
