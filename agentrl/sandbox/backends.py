"""How a sandbox server is started: bubblewrap, Docker, or a bare subprocess.

Each backend starts the same stdlib-only fork server (``_server.py``) and returns a
:class:`Channel`, a bidirectional byte stream to it plus a ``kill`` that tears the whole
sandbox down.  What differs is the isolation around the server:

* ``bwrap``: new mount/PID/network/IPC/UTS (and cgroup) namespaces, read-only binds of only
  ``/usr`` (+ the ``/bin``, ``/lib*`` symlinks) and the real interpreter's install prefix, a
  size-capped tmpfs ``/tmp``, a private ``/dev/mqueue``, a cleared environment,
  ``--die-with-parent``, ``--new-session``; the server runs as an unprivileged uid and inherits
  the descriptors of the worker's run cgroup where one can be made (``cgroup.py``).  When the runner is root, a user namespace is prepared
  that maps inside-uid 1000 to a per-worker host uid (leased with ``flock`` so parallel workers,
  even in other processes, never share one: RLIMIT_NPROC counts per uid and is ignored for
  root) and where creating further user namespaces is disabled.
* ``docker``: a container per worker through the ``docker`` SDK (network off, read-only root,
  tmpfs /tmp, pids/memory limits, all capabilities dropped, uid 65534).
* ``subprocess``: the server as a plain child process with rlimits only.  NOT isolated: it can
  read and write what the runner can and reach the network.  A warning is logged once.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from . import cgroup as run_cgroup

log = logging.getLogger(__name__)

SERVER_SOURCE = (Path(__file__).with_name("_server.py")).read_bytes()
# The interpreter is started with this short program, which reads the server's source (its
# length is argv[1]) from stdin and runs it; the source never appears on a command line.
BOOTSTRAP = (
    "import os, sys\n"
    "n, src = int(sys.argv[1]), b''\n"
    "while len(src) < n:\n"
    "    chunk = os.read(0, n - len(src))\n"
    "    if not chunk:\n"
    "        raise SystemExit('sandbox server source truncated')\n"
    "    src += chunk\n"
    "exec(compile(src, 'agentrl_sandbox_server', 'exec'))\n"
)


def server_argv(exe: str, config: dict) -> list[str]:
    """Interpreter command line of the server (its source follows on stdin)."""
    # -S: no site module, so no site-packages on sys.path (only the standard library)
    return [exe, "-I", "-S", "-B", "-c", BOOTSTRAP, str(len(SERVER_SOURCE)), json.dumps(config)]
SANDBOX_PYTHON = "/sandbox/bin/python3"  # the interpreter's path inside (pid 1's cmdline)
SANDBOX_HOSTNAME = "sandbox"  # the UTS name inside a bwrap sandbox (never the host's)
INSIDE_UID = 1000  # uid the server and solutions have inside a bwrap sandbox
UID_BASE = 610_000  # host uids leased to workers when the runner is root: UID_BASE + k
UID_COUNT = 4096
LOCK_DIR = Path(tempfile.gettempdir()) / "agentrl-sandbox-uids"
DOCKER_IMAGE = os.environ.get("AGENTRL_SANDBOX_IMAGE", "python:3.11-slim")
BACKENDS = ("bwrap", "docker", "subprocess")

# bwrap --die-with-parent uses PR_SET_PDEATHSIG, which fires when the *thread* that started the
# process exits.  All sandboxes are therefore started from this one long-lived thread.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentrl-sandbox-spawn")
_warned_unisolated = False
_warn_lock = threading.Lock()


class BackendError(RuntimeError):
    """A sandbox could not be started or stopped responding (not caused by a solution)."""


def real_python() -> tuple[str, str]:
    """(real path of the running interpreter binary, real path of its install prefix).

    Shims and venv symlinks are resolved so that the sandbox starts the real binary (a pyenv
    shim costs ~1 s per call) and only that installation is bound into the sandbox.
    """
    return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)


# ---------------------------------------------------------------- channel


class Channel:
    """Length-prefixed JSON messages to and from a server over two file descriptors."""

    def __init__(self, wfd: int, rfd: int, kill: Callable[[bool], None], describe: str):
        self.wfd, self.rfd, self._kill, self.describe = wfd, rfd, kill, describe
        self._rbuf = bytearray()
        self.proc: subprocess.Popen[bytes] | None = None  # the host process, if any
        self.stderr_file: IO[bytes] | None = None  # its stderr, for start-up errors
        self.helper: subprocess.Popen[bytes] | None = None  # user-namespace holder to reap

    def send(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        data = memoryview(struct.pack(">I", len(body)) + body)
        try:
            while data:
                data = data[os.write(self.wfd, data):]
        except OSError as e:
            raise BackendError(f"sandbox server went away while sending ({e})") from e

    def _read(self, n: int, deadline: float) -> bytes:
        while len(self._rbuf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.rfd], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.rfd, max(1 << 16, n - len(self._rbuf)))
            except OSError as e:
                raise BackendError(f"sandbox server went away ({e})") from e
            if not chunk:
                raise BackendError("sandbox server exited")
            self._rbuf += chunk
        out = bytes(self._rbuf[:n])
        del self._rbuf[:n]
        return out

    def recv(self, timeout: float, max_bytes: int) -> dict:
        """Next message; TimeoutError after ``timeout`` s, BackendError on EOF or garbage."""
        deadline = time.monotonic() + timeout
        (size,) = struct.unpack(">I", self._read(4, deadline))
        if size > max_bytes:
            raise BackendError(f"sandbox server sent an oversized message ({size} bytes)")
        try:
            return json.loads(self._read(size, deadline))
        except ValueError as e:
            raise BackendError(f"sandbox server sent garbage ({e})") from e

    def kill(self, graceful: bool = True) -> None:
        """Stop the server and everything in its sandbox (graceful: let an idle one exit)."""
        self._kill(graceful)


# ---------------------------------------------------------------- uid leases


class UidLease:
    """An unprivileged host uid reserved for one worker (flock on a per-uid lock file)."""

    def __init__(self):
        LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        start = (os.getpid() * 7) % UID_COUNT
        for k in range(UID_COUNT):
            uid = UID_BASE + (start + k) % UID_COUNT
            fd = os.open(LOCK_DIR / f"{uid}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise BackendError("no free sandbox uid")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_USERNS_HELPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) != 0:
    sys.exit("unshare(CLONE_NEWUSER) failed: errno %d" % ctypes.get_errno())
os.write(1, b"u")
os.read(0, 1)
with open("/proc/sys/user/max_user_namespaces", "w") as f:
    f.write("0")
os.write(1, b"k")
os.read(0, 1)
"""


def _make_userns(host_uid: int) -> tuple[int, subprocess.Popen]:
    """A user namespace mapping 0->0 (for bwrap's setup) and INSIDE_UID->host_uid.

    Creating user namespaces inside it is disabled (max_user_namespaces=0).  Returns an fd of
    the namespace and the helper process holding it (kill it once bwrap has joined).
    """
    exe, _ = real_python()
    helper = _SPAWNER.submit(
        _spawn, [exe, "-I", "-S", "-c", _USERNS_HELPER], stderr=subprocess.PIPE
    ).result()
    assert helper.stdin and helper.stdout and helper.stderr
    try:
        if os.read(helper.stdout.fileno(), 1) != b"u":
            raise BackendError(f"user namespace helper failed: {helper.stderr.read().decode()}")
        for kind in ("uid", "gid"):
            with open(f"/proc/{helper.pid}/{kind}_map", "w") as f:
                f.write(f"0 0 1\n{INSIDE_UID} {host_uid} 1\n")
        os.write(helper.stdin.fileno(), b"g")
        if os.read(helper.stdout.fileno(), 1) != b"k":
            raise BackendError(f"user namespace helper failed: {helper.stderr.read().decode()}")
        return os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY), helper
    except BaseException:
        helper.kill()
        helper.wait()
        raise


# ---------------------------------------------------------------- launchers


def descendants(root: int) -> list[int]:
    """Host pids below ``root`` (children first, so that killing in order starts at the top)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo += children.get(pid, [])
    return out



def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def _hidden_package_dirs(prefix: str) -> list[str]:
    """bwrap arguments that cover every third-party package directory of the bound
    interpreters with an empty read-only tmpfs: the prefix's ``lib/python*/site-packages`` and
    the system's ``/usr[/local]/lib/python*/{site,dist}-packages``.  With ``-S`` they are not on
    ``sys.path`` anyway; hidden, a solution cannot append them either, so only the standard
    library is importable and results never depend on what the host installed (issue 42)."""
    found: set[Path] = set()
    for root in (Path(prefix), Path("/usr"), Path("/usr/local")):
        for pattern in ("lib/python*/site-packages", "lib/python*/dist-packages", "lib/python3/dist-packages"):
            found.update(p for p in root.glob(pattern) if p.is_dir() and not p.is_symlink())
    out: list[str] = []
    for path in sorted(str(p) for p in found):
        out += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
    return out


def _traversable_parents(path: str) -> list[str]:
    """bwrap arguments that create every ancestor of ``path`` (below ``/``) with mode 0755.

    bwrap creates the mount point's missing parents with the *source's* modes, so a prefix under
    a 0700 home (pyenv in ``/root``) would be unreachable for the sandbox's unprivileged uid:
    the loader then silently falls back to the system's libpython and stdlib (another
    interpreter version).  Only these empty directories are made traversable; nothing else of
    the home is visible.
    """
    parts = Path(path).parts[1:-1]
    out: list[str] = []
    for i in range(len(parts)):
        out += ["--perms", "0755", "--dir", "/" + "/".join(parts[: i + 1])]
    return out


def bwrap_argv(*, root: bool, userns_fd: int | None, tmpfs_mb: int,
               cgroup: dict | None = None) -> list[str]:
    """The full bwrap command line for one worker (see the module docstring).

    cgroup: the server's view of the worker's run cgroup (``RunCgroup.config()``), or None.
    """
    exe, prefix = real_python()
    args = ["bwrap"]
    if userns_fd is not None:
        args += ["--userns", str(userns_fd)]
    else:
        args += ["--unshare-user", "--disable-userns"]
    # = --unshare-all, spelled out because --unshare-all implies --unshare-user-try, which
    # bwrap refuses together with --userns.
    args += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
             "--unshare-cgroup-try"]
    args += ["--hostname", SANDBOX_HOSTNAME]
    args += ["--die-with-parent", "--new-session", "--clearenv",
             "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"]
    args += _system_binds()
    binds = {prefix}
    if not exe.startswith(prefix + "/"):
        binds.add(os.path.dirname(exe))
    for path in sorted(binds):
        if path != "/usr" and not path.startswith("/usr/"):
            args += _traversable_parents(path) + ["--ro-bind", path, path]
    args += _hidden_package_dirs(prefix)
    # the binary again at a neutral path, which pid 1's /proc/1/cmdline then names; it finds
    # its standard library through its built-in prefix (bound above at the same path).  A
    # relocatable build (built-in prefix elsewhere) keeps its real path.
    inner_exe = exe
    if os.path.realpath(sysconfig.get_config_var("prefix") or "/nonexistent") == prefix:
        args += ["--ro-bind", exe, SANDBOX_PYTHON]
        inner_exe = SANDBOX_PYTHON
    args += ["--proc", "/proc", "--dev", "/dev",
             # a private POSIX message-queue file system: the server lists and unlinks the
             # queues a run leaves in the (per-worker) IPC namespace
             "--mqueue", "/dev/mqueue",
             "--perms", "1777", "--size", str(tmpfs_mb << 20), "--tmpfs", "/tmp",
             "--remount-ro", "/", "--chdir", "/tmp",
             # the server is the PID namespace's init: it reaps every orphan, signals from
             # inside the namespace cannot kill or stop it, and the outer bwrap reaps it
             "--as-pid-1"]
    inner = server_argv(inner_exe, {"contained": True, "cgroup": cgroup})
    if root:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
                 shutil.which("setpriv") or "/usr/bin/setpriv",
                 "--reuid", str(INSIDE_UID), "--regid", str(INSIDE_UID), "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all"]
    else:
        args += ["--"]
    return args + inner


def _spawn(argv: list[str], stderr: Any, pass_fds: tuple[int, ...] = (),
           env: dict[str, str] | None = None, cwd: str | None = None,
           start_new_session: bool = False) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            pass_fds=pass_fds, env=env, cwd=cwd,
                            start_new_session=start_new_session)


def _popen_channel(argv: list[str], *, describe: str, pass_fds: tuple[int, ...] = (),
                   cleanup: list[Callable[[], object]] | None = None,
                   env: dict[str, str] | None = None, cwd: str | None = None,
                   start_new_session: bool = False) -> Channel:
    """Start ``argv`` (from the spawner thread), feed it the server source, wrap it."""
    stderr = tempfile.TemporaryFile()
    proc = _SPAWNER.submit(_spawn, argv, stderr, pass_fds, env, cwd, start_new_session).result()
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def kill(graceful: bool = True) -> None:
        # Graceful: EOF on its control pipe makes an idle server exit; bwrap's init then
        # exits, and every process is reaped by its own parent.  Otherwise kill the sandbox's
        # processes from the inside out (bwrap's pid 1 first: the PID namespace dies with it
        # and the outer bwrap reaps it), then the top process.
        try:
            stdin.close()
        except OSError:
            pass
        if graceful:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            for pid in descendants(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    log.error("sandbox process %d did not die", proc.pid)
        for f in (stdout, stderr):
            try:
                f.close()
            except OSError:
                pass
        for fn in cleanup or ():
            fn()

    ch = Channel(stdin.fileno(), stdout.fileno(), kill, describe)
    try:
        stdin.write(SERVER_SOURCE)
        stdin.flush()
    except OSError:
        pass  # it died at once; the worker reads EOF and reports stderr
    ch.proc, ch.stderr_file = proc, stderr
    return ch


def start_bwrap(tmpfs_mb: int) -> Channel:
    """Start one bwrap worker; the caller must ``kill()`` it."""
    root = os.geteuid() == 0
    cleanup: list[Callable[[], object]] = []
    pass_fds: tuple[int, ...] = ()
    userns_fd: int | None = None
    helper: subprocess.Popen[bytes] | None = None
    lease: UidLease | None = None
    cg = run_cgroup.create()
    try:
        if root:
            lease = UidLease()
            userns_fd, helper = _make_userns(lease.uid)
            pass_fds = (userns_fd,)
            cleanup.append(lease.release)
        if cg is not None:
            pass_fds += cg.pass_fds()
            cleanup.append(cg.remove)
        argv = bwrap_argv(root=root, userns_fd=userns_fd, tmpfs_mb=tmpfs_mb,
                          cgroup=cg.config() if cg is not None else None)
        ch = _popen_channel(argv, pass_fds=pass_fds, cleanup=cleanup,
                            describe=f"bwrap(uid {lease.uid if lease else os.getuid()})")
    except BaseException:
        if lease:
            lease.release()
        if cg is not None:
            cg.remove()
        raise
    finally:
        if userns_fd is not None:
            os.close(userns_fd)
        if cg is not None:
            cg.close_fds()
    ch.helper = helper  # killed by the worker once the server is ready
    return ch


def warn_unisolated() -> None:
    """Log, once per process, that the subprocess backend is not a sandbox."""
    global _warned_unisolated
    with _warn_lock:
        if _warned_unisolated:
            return
        _warned_unisolated = True
    log.warning(
        "agentrl.sandbox: using the 'subprocess' backend: code runs with rlimits only and is "
        "NOT isolated (it can read/write your files and use the network%s). Install bubblewrap "
        "(apt-get install bubblewrap) for a real sandbox.",
        "; as root the process limit is not enforced either" if os.geteuid() == 0 else "",
    )


def start_subprocess(tmpfs_mb: int) -> Channel:
    """Start the server as a plain process (no isolation: see warn_unisolated)."""
    exe, _ = real_python()
    tmp = tempfile.mkdtemp(prefix="agentrl-sbx-")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    argv = server_argv(exe, {"contained": False, "tmp": tmp})
    return _popen_channel(
        argv, cleanup=[functools.partial(shutil.rmtree, tmp, True)], env=env, cwd=tmp,
        start_new_session=True, describe="subprocess",
    )


class _DockerStream:
    """Demultiplexes a Docker attach socket (8-byte frame headers) into a pipe fd."""

    def __init__(self, sock):
        self.sock = sock
        self.r, self.w = os.pipe()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 8:
                    kind, size = buf[0], struct.unpack(">I", buf[4:8])[0]
                    if len(buf) < 8 + size:
                        break
                    if kind == 1:
                        os.write(self.w, buf[8:8 + size])
                    buf = buf[8 + size:]
        except OSError:
            pass
        finally:
            os.close(self.w)


def start_docker(tmpfs_mb: int) -> Channel:
    """Start one worker container through the docker SDK (an engine must be reachable)."""
    import docker  # optional dependency

    client = docker.from_env()
    container = client.containers.create(
        DOCKER_IMAGE,
        server_argv("python3", {"contained": True}),
        stdin_open=True, network_disabled=True, read_only=True, user="65534:65534",
        tmpfs={"/tmp": f"size={tmpfs_mb}m,mode=1777"}, cap_drop=["ALL"],
        security_opt=["no-new-privileges"], pids_limit=512, mem_limit="2g", auto_remove=False,
    )
    sock = container.attach_socket(params={"stdin": 1, "stdout": 1, "stream": 1})
    raw = getattr(sock, "_sock", sock)
    container.start()
    stream = _DockerStream(raw)
    wfd_sock = socket.socket(fileno=os.dup(raw.fileno()))

    def kill(graceful: bool = True) -> None:
        try:
            container.remove(force=True)
        except Exception:  # noqa: BLE001 - best effort; the engine may be gone
            log.exception("could not remove sandbox container")
        for s in (wfd_sock, raw):
            try:
                s.close()
            except OSError:
                pass
        os.close(stream.r)

    ch = Channel(wfd_sock.fileno(), stream.r, kill, f"docker({DOCKER_IMAGE})")
    wfd_sock.sendall(SERVER_SOURCE)
    return ch


STARTERS = {"bwrap": start_bwrap, "docker": start_docker, "subprocess": start_subprocess}
