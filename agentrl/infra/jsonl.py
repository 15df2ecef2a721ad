"""Reading a JSON Lines file whose errors name the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def jsonl_rows(path: str | Path) -> list[tuple[str, Any]]:
    """The decoded non-blank lines of `path`, each with its place `"path:line"` (1-based), for
    the caller's own field errors.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is not valid JSON (`"path:line: invalid JSON (reason)"`).
    """
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rows.append((where, json.loads(line)))
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON ({e.msg})") from None
    return rows
