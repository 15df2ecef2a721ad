"""Per-worker cgroups that cap a run's TOTAL memory and process count (issue 20).

RLIMIT_AS limits one process; a run that forks N processes could use N times its memory. When
the runner may create cgroups (root, or a delegated cgroup v2 subtree), every bwrap worker gets
its own cgroup for its runs: the runner creates it on the host and opens its control files,
and the descriptors are inherited by the sandbox server (pid 1 inside; no ``/sys`` is mounted
there).  Each run's child moves itself in (writes ``0`` to ``cgroup.procs`` through the
descriptor, which the kernel checks against the *opener's* credentials, i.e. root) before it
lowers its limits, then closes every descriptor; the server writes the run's limits
(``memory_mb`` -> the memory limit, ``max_procs`` -> ``pids.max``) and reads the cgroup's OOM-kill
counter after the run.  The solution never holds a descriptor, so it cannot leave the cgroup
or raise its limits, and the server (outside the run's cgroup) is never charged for or killed by
the run's memory.

cgroup v2 (a ``cgroup2`` mount with the memory and pids controllers) is preferred; cgroup v1's
``memory`` and ``pids`` hierarchies are used otherwise.  Without either, :func:`create` returns
None and the sandbox falls back to per-process RLIMIT_AS and per-uid RLIMIT_NPROC (a run's total
memory is then only bounded by ``max_procs * memory_mb``; docs/sandbox.md).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)
_names = itertools.count()


@dataclass
class RunCgroup:
    """The cgroup(s) of one worker's runs and the descriptors handed to its server.

    kind: ``"v2"`` or ``"v1"``.  dirs: the created directories (removed by :meth:`remove`).
    fds: {``procs``: [fd, ...] (one per hierarchy), ``mem``: fd of the memory limit,
    ``pids``: fd of ``pids.max`` or None, ``oom``: read fd of the file with ``oom_kill N``}.
    """

    kind: str
    dirs: list[Path]
    fds: dict = field(default_factory=dict)

    def config(self) -> dict:
        """What the server is told (descriptor numbers; they are inherited unchanged)."""
        return {"kind": self.kind, **self.fds}

    def pass_fds(self) -> tuple[int, ...]:
        f = self.fds
        return tuple(x for x in [*f["procs"], f["mem"], f["pids"], f["oom"]] if x is not None)

    def close_fds(self) -> None:
        """Close the runner's copies (the server keeps its own)."""
        for fd in self.pass_fds():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = {"procs": [], "mem": None, "pids": None, "oom": None}

    def remove(self) -> None:
        """Remove the directories (once every process in them is gone; retried briefly)."""
        self.close_fds()
        for d in reversed(self.dirs):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            else:
                log.warning("could not remove sandbox cgroup %s", d)


def _mounts() -> list[tuple[str, str, set[str]]]:
    """[(mount point, fs type, super options)] of the cgroup mounts."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fstype, _, opts = (post.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                out.append((pre.split()[4], fstype, set(opts.split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """{controller or '' (v2): this process's cgroup path} from /proc/self/cgroup."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                out[c] = path
    return out


def _new_dir(parent: Path) -> Path:
    d = parent / f"agentrl-sbx-{os.getpid()}-{next(_names)}"
    d.mkdir()
    return d


def _open(path: Path, write: bool = True) -> int:
    return os.open(path, (os.O_WRONLY if write else os.O_RDONLY) | os.O_CLOEXEC)


def _create_v2(mount: str, own: str) -> RunCgroup | None:
    parent = Path(mount + own.rstrip("/"))
    try:
        enabled = set((parent / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            # only possible where the parent has no processes of its own (or is the root)
            (parent / "cgroup.subtree_control").write_text("+memory +pids")
        d = _new_dir(parent)
    except OSError:
        return None
    cg = RunCgroup("v2", [d])
    try:
        try:
            (d / "memory.swap.max").write_text("0")
        except OSError:
            pass
        cg.fds = {"procs": [_open(d / "cgroup.procs")], "mem": _open(d / "memory.max"),
                  "pids": _open(d / "pids.max"), "oom": _open(d / "memory.events", False)}
        return cg
    except OSError:
        cg.remove()
        return None


def _create_v1(mounts: list[tuple[str, str, set[str]]], own: dict[str, str]) -> RunCgroup | None:
    roots = {c: m for m, kind, opts in mounts if kind == "cgroup"
             for c in ("memory", "pids") if c in opts}
    if "memory" not in roots or "memory" not in own:
        return None
    cg = RunCgroup("v1", [])
    try:
        mem = _new_dir(Path(roots["memory"] + own["memory"].rstrip("/")))
        cg.dirs.append(mem)
        try:
            (mem / "memory.swappiness").write_text("0")
        except OSError:
            pass
        fds: dict = {"procs": [_open(mem / "cgroup.procs")], "mem": _open(mem / "memory.limit_in_bytes"),
                     "pids": None, "oom": _open(mem / "memory.oom_control", False)}
        cg.fds = fds
        if "pids" in roots and "pids" in own:
            pids = _new_dir(Path(roots["pids"] + own["pids"].rstrip("/")))
            cg.dirs.append(pids)
            fds["procs"].append(_open(pids / "cgroup.procs"))
            fds["pids"] = _open(pids / "pids.max")
        return cg
    except OSError:
        cg.remove()
        return None


def create() -> RunCgroup | None:
    """A fresh cgroup for one worker's runs, or None where this process cannot make one."""
    if os.environ.get("AGENTRL_SANDBOX_NO_CGROUP"):
        return None
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError):
        return None
    for mount, kind, _ in mounts:
        if kind == "cgroup2" and "" in own:
            try:
                ctrls = set(Path(mount, "cgroup.controllers").read_text().split())
            except OSError:
                continue
            if {"memory", "pids"} <= ctrls:
                cg = _create_v2(mount, own[""])
                if cg is not None:
                    return cg
    return _create_v1(mounts, own)
