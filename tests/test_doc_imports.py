"""What the docs tell a user to import exists: every `from agentrl... import ...` / `import
agentrl...` line of docs/*.md and README.md runs, and every dotted name `agentrl.x.y` they
quote in backticks resolves to a module or an attribute. (docs/tools.md, docs/code_sandbox.md and
docs/rewards.md said `from agentrl.env.base import make_env`, an ImportError: it is
`from agentrl import make_env`.)"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
PACKAGES = r"agentrl(?:_envs|_tools)?"
IMPORT = re.compile(rf"^\s*(?:from {PACKAGES}(?:\.\w+)* import [\w, ]+|import {PACKAGES}(?:\.\w+)*)\s*$")
QUOTED = re.compile(rf"`({PACKAGES}(?:\.\w+)+)")
NOT_PYTHON = {"agentrl.envs"}
"""Quoted names that are not Python objects: the entry-point group of installed envs."""


def _lines(pattern: re.Pattern, group: int | None) -> list[tuple[str, str]]:
    out = []
    for f in DOCS:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if group is None:
                if pattern.match(line):
                    out.append((f"{f.name}:{n}", line.strip()))
            else:
                out += [(f"{f.name}:{n}", m.group(group)) for m in pattern.finditer(line)]
    return out


IMPORTS = _lines(IMPORT, None)
NAMES = sorted({name for _, name in _lines(QUOTED, 1)} - NOT_PYTHON)


def test_the_docs_have_import_lines_to_check():
    where = {w.split(":")[0] for w, _ in IMPORTS}
    assert {"tools.md", "code_sandbox.md", "rewards.md", "README.md"} <= where
    assert ("tools.md", "from agentrl import make_env") in {(w.split(":")[0], x) for w, x in IMPORTS}


@pytest.mark.parametrize("where, line", IMPORTS, ids=[w for w, _ in IMPORTS])
def test_doc_import_line_runs(where, line):
    exec(compile(line, where, "exec"), {})  # ImportError names the symbol the doc got wrong


def resolve(name: str) -> object:
    """The module or attribute `name` (the longest importable module prefix, then attributes)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)  # AttributeError names what is missing
        return obj
    raise ModuleNotFoundError(name)


@pytest.mark.parametrize("name", NAMES)
def test_dotted_names_quoted_in_the_docs_resolve(name):
    assert resolve(name) is not None
