"""The layout measures of issue 37, read from the source (`python benchmarks/layout_report.py`):
largest file, train.py and train(), functions over 100 lines, Learner.update, import cycles by
module and by folder (imports inside functions counted), in-tree imports inside functions,
top-level modules of agentrl/, and the places that construct an engine or choose a renderer.

The import graph is tests/test_layout.py's (the same reading: every import, lazy ones too);
the construction sites are calls, found with `ast`, of the engine classes, of the engine
builders and of the renderer classes (their own definitions excluded). Prints a markdown table.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import test_layout as layout  # noqa: E402

LIB = ROOT / "agentrl"
SANDBOX_SERVER = LIB / "sandbox" / "_server.py"  # one source sent to the sandbox (issue 37)
ENGINE_CLASSES = {"HFEngine", "VisionHFEngine", "VLLMEngine", "VisionVLLMEngine"}
ENGINE_BUILDERS = {"make_engine", "vision_engine", "vision_engine_of_dir", "make_teacher_engine"}
RENDERER_CLASSES = {"ChatRenderer", "VisionChatRenderer"}


def lines(f: Path) -> int:
    """Lines of file `f`."""
    return len(f.read_text().splitlines())


def functions(f: Path) -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to the last line of the body) of every function of `f`."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out.append((name, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(f.read_text(), str(f)), "")
    return out


def call_sites(names: set[str]) -> list[tuple[str, str]]:
    """(`path:line name`, `path:function`) of every call in agentrl/ of a function or class named
    in `names` (`X(...)` or `mod.X(...)`), in file and line order; the function is the innermost
    `def` around the call (`<module>` at module level)."""
    out = []

    def visit(node: ast.AST, f: Path, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = child.name
            elif isinstance(child, ast.Call):
                fn = child.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name in names:
                    rel = f.relative_to(ROOT)
                    out.append((child.lineno, f"{rel}:{child.lineno} {name}", f"{rel}:{where}"))
            visit(child, f, inner)

    for f in sorted(LIB.rglob("*.py")):
        n = len(out)
        visit(ast.parse(f.read_text(), str(f)), f, "<module>")
        out[n:] = sorted(out[n:])
    return [(a, b) for _, a, b in out]


def sites(names: set[str]) -> str:
    """`N calls in M functions: ...` for `call_sites(names)`."""
    calls = call_sites(names)
    places = sorted({w for _, w in calls})
    return f"{len(calls)} calls in {len(places)} functions: " + ", ".join(c for c, _ in calls)


def report() -> list[tuple[str, str]]:
    """(measure, value) rows."""
    files = sorted(LIB.rglob("*.py"))
    sizes = sorted(((lines(f), f) for f in files), reverse=True)
    big = next((n, f) for n, f in sizes if f != SANDBOX_SERVER)
    train = LIB / "train.py"
    train_fns = dict(functions(train))
    long_fns = sorted(((n, f"{f.relative_to(ROOT)}:{name}") for f in files
                       for name, n in functions(f) if n > 100), reverse=True)
    local = LIB / "learner" / "local.py"
    update = dict(functions(local)).get("Learner.update") if local.exists() else None
    counts = layout.layout_counts()
    top = sorted(f.stem for f in LIB.glob("*.py") if f.name != "__init__.py")
    builders = call_sites(ENGINE_BUILDERS)
    builder_defs = sorted(f"{f.relative_to(ROOT)}:{name}" for f in files for name, _ in functions(f)
                          if name in ENGINE_BUILDERS)
    fmt_cycles = "; ".join(" <-> ".join(c) for c in counts["folder_cycles"]) or "none"
    return [
        ("largest file (outside sandbox/_server.py)", f"{big[0]} ({big[1].relative_to(ROOT)}); "
                                                      f"_server.py {lines(SANDBOX_SERVER)}"),
        ("train.py lines / train() lines", f"{lines(train)} / {train_fns.get('train', 'absent')}"),
        ("functions over 100 lines", f"{len(long_fns)}: " + ", ".join(f"{n} {w}" for n, w in long_fns)),
        ("Learner.update lines", str(update)),
        ("cycles by module (lazy counted)", str(len(counts["module_cycles"]))),
        ("cycles by folder (lazy counted)", f"{len(counts['folder_cycles'])}: {fmt_cycles}"),
        ("forbidden folder edges", f"{len(counts['forbidden_folder_edges'])}: "
                                   + ", ".join(counts["forbidden_folder_edges"])),
        ("in-tree imports inside functions (agentrl/)", str(counts["lazy_in_tree"])),
        ("lazy third-party imports not allow-listed", str(counts["lazy_third_party_not_allowed"])),
        ("top-level modules in agentrl/", f"{len(top)}: {', '.join(top)}"),
        ("engine constructions (HF/vLLM classes)", sites(ENGINE_CLASSES)),
        ("engine builder functions / their calls", f"{len(builder_defs)} ({', '.join(builder_defs)}) / "
                                                   f"{len(builders)}"),
        ("renderer choices (ChatRenderer/VisionChatRenderer)", sites(RENDERER_CLASSES)),
    ]


def main() -> None:
    print("| measure | value |\n| --- | --- |")
    for k, v in report():
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
