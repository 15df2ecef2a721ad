"""Who may write a run folder, and how: one process at a time, never through a link.

- `lock_run(out)`: an exclusive `fcntl.flock` on `OUT/.agentrl.lock`, held for the run's life
  (until `unlock_run(out)` or the process ends: the OS releases a dead process's lock, so a
  stale lock file never blocks). The holder's pid is written in the file; a second process
  (`--resume` of the same folder, or a new run into the same `--out`) gets `RunLocked` naming it.
- `find_links(out)`: every symbolic link under `out` (not followed). A resumed run and
  `--overwrite` refuse a folder that has one (`check_no_links`) before they write or delete
  anything, so nothing outside the run is overwritten or deleted through a link.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".agentrl.lock"
"""The lock file in OUT (left in place after the run: removing it would race a waiting locker)."""

_HELD: dict[str, int] = {}  # resolved OUT -> the open, locked descriptor of this process


class RunLocked(RuntimeError):
    """Another live process holds the run folder's lock."""


def lock_run(out: Path) -> None:
    """Take the exclusive lock of run folder `out` (created when absent) for this process;
    re-entrant within it (a second call is a no-op until `unlock_run`).

    Raises:
        RunLocked: another process holds it (names its pid, as written in the lock file).
        OSError: `out` cannot be created or the lock file opened (e.g. read-only folder).
    """
    out = Path(out)
    key = str(out.resolve())
    if key in _HELD:
        return
    out.mkdir(parents=True, exist_ok=True)
    lock = out / LOCK_NAME
    if lock.is_symlink():
        raise RunLocked(f"out: {lock} is a symbolic link; agentrl never writes through a link: remove it")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunLocked(f"out: {out} is in use by another agentrl process (pid {holder}); wait for it "
                        "to finish or stop it, or choose another --out") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd


def unlock_run(out: Path) -> None:
    """Release this process's lock of `out` (no-op when it holds none)."""
    fd = _HELD.pop(str(Path(out).resolve()), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor releases the flock


def find_links(out: Path) -> list[Path]:
    """The symbolic links under `out` (`out` itself excluded), sorted; links are not followed."""
    links = []
    for root, dirs, files in os.walk(out, followlinks=False):
        for name in dirs + files:
            p = Path(root) / name
            if p.is_symlink():
                links.append(p)
    return sorted(links)


def check_no_links(out: Path, doing: str) -> None:
    """Refuse run folder `out` when it holds a symbolic link anywhere.

    Raises:
        ValueError: naming the first link, its target and `doing` (e.g. "--resume").
    """
    links = find_links(Path(out))
    if links:
        p = links[0]
        more = f" (and {len(links) - 1} more)" if len(links) > 1 else ""
        raise ValueError(f"out: {p} is a symbolic link (to {os.readlink(p)}){more}; {doing} never writes "
                         "or deletes through a link: remove it, or choose another --out")
