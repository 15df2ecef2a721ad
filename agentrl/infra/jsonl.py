"""Reading a JSON Lines file whose errors name the file and line; `jsonable`: values as strict JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


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


def jsonable(x: Any) -> Any:
    """`x` with NaN/inf floats as None, numpy scalars/arrays as Python values, tuples as lists
    and any other object as its `str` (so rows always serialise as strict JSON)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, (str, int, bool)):
        return x
    return str(x)
