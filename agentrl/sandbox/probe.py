"""Does a sandbox backend work on this machine? One real job through a fresh `Worker`.

Its own module: it needs both the backends (`backends.py`) and the worker that drives them
(`worker.py`, which imports `backends`).
"""

from __future__ import annotations

import base64
import functools
import shutil

from .worker import Worker


@functools.cache
def probe(name: str) -> str | None:
    """None if backend ``name`` works here, else the reason it does not (cached)."""
    if name == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    if name == "docker":
        try:
            import docker

            docker.from_env(timeout=3).ping()
        except Exception as e:  # noqa: BLE001 - any failure means 'not available'
            return f"no reachable docker engine ({type(e).__name__})"
    try:
        w = Worker(name, tmpfs_mb=16)
        try:
            res = w.run({"mode": "code", "code": "print(6*7)", "setup": "", "tests": [],
                         "tokens": ["t"], "stdin": "",
                         "limits": {"wall_s": 10.0, "cpu_s": 10.0, "memory_mb": 512,
                                    "max_procs": 8, "file_size_mb": 1, "output_bytes": 4096}},
                        timeout=30.0)
        finally:
            w.close()
    except Exception as e:  # noqa: BLE001
        return f"probe failed: {type(e).__name__}: {e}"
    if base64.b64decode(res.get("stdout", "")) != b"42\n":
        return f"probe produced unexpected output: {res!r:.300}"
    return None
