"""A small on-disk cache of JSON records, one file per key, for results worth keeping across
runs on one machine (the code env's reference checks and trivial-solution probes,
`agentrl_envs.reference_check` and `agentrl_envs.trivial_probe`).

A record is written atomically (a temporary file in the same folder, then `os.replace`), so a
reader sees the old record or the new one, never half of one. The cache only saves time: a
record that cannot be read (missing, corrupt, not a JSON object) is a miss, and one that cannot
be written (a read-only cache) is not kept; neither raises.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def cache_dir(name: str) -> Path:
    """`$AGENTRL_CACHE_DIR/NAME`, default `~/.cache/agentrl/NAME` (not created here)."""
    root = os.environ.get("AGENTRL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "agentrl")
    return Path(root) / name


def load_record(path: Path) -> dict[str, Any] | None:
    """The JSON object stored at `path`, or None when there is none: no file, an unreadable or
    corrupt one, or JSON that is not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # ValueError: invalid JSON or text (UnicodeDecodeError)
        return None
    return data if isinstance(data, dict) else None


def store_record(path: Path, record: dict[str, Any]) -> None:
    """Write `record` (JSON-serialisable) to `path` atomically, creating its folder; an
    `OSError` (a read-only or full cache) leaves the cache as it was and is not raised. A write
    that fails leaves no temporary file behind.

    Raises:
        TypeError: `record` holds a value JSON cannot encode (a bug of the caller).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    except OSError:  # a read-only cache is only slower
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:  # a full cache, or a folder where the file should be: only slower
        pass
    finally:
        if os.path.exists(tmp):  # the write or the replace failed (a replaced file is gone)
            os.unlink(tmp)
