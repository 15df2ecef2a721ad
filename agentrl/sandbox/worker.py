"""One warm sandbox: a running fork server plus the protocol to give it jobs.

A worker is used by one thread at a time (the pool hands them out).  If the server dies, stops
answering or misbehaves, the whole sandbox is killed and a fresh one is started on the next
job; callers see :class:`~agentrl.sandbox.backends.BackendError` only if that also fails.
"""

from __future__ import annotations

import logging
import sys

from .backends import STARTERS, BackendError, Channel

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
#: Job keys sent in the second message (see ``_server.run_job``).
SECOND_MESSAGE = ("tests", "tokens", "imports")
GRACE_S = 5.0  # beyond the job's wall limit, for the server's own bookkeeping and cleanup


class Worker:
    """A sandbox server of backend ``backend`` with a ``tmpfs_mb`` MiB /tmp (started lazily)."""

    def __init__(self, backend: str, tmpfs_mb: int = 128):
        if backend not in STARTERS:
            raise ValueError(f"unknown sandbox backend {backend!r}; choose from {list(STARTERS)}")
        self.backend = backend
        self.tmpfs_mb = tmpfs_mb
        self._ch: Channel | None = None
        self.starts = 0  # how many servers this worker has started (restarts = starts - 1)
        self.info: dict = {}
        self._shut = False

    def _start(self) -> Channel:
        ch = STARTERS[self.backend](self.tmpfs_mb)
        self.starts += 1
        try:
            hello = ch.recv(START_TIMEOUT_S, 1 << 16)
            if not hello.get("ready"):
                raise BackendError(f"unexpected greeting {hello!r:.200}")
            if self.backend != "docker" and hello.get("python") != sys.version:
                # e.g. the real binary loaded another installation's libpython because the
                # sandbox could not read its own prefix: refuse rather than judge with it
                raise BackendError(f"sandbox runs Python {hello.get('python')!r} "
                                   f"(prefix {hello.get('prefix')!r}), not this interpreter "
                                   f"{sys.version!r} ({sys.prefix!r})")
        except (BackendError, TimeoutError) as e:
            err = ""
            f = ch.stderr_file
            if f is not None:
                f.seek(0)
                err = f.read(4000).decode(errors="replace").strip()
            ch.kill(graceful=False)
            raise BackendError(f"{self.backend} sandbox failed to start: {e!r} {err}") from e
        finally:
            helper = ch.helper
            if helper is not None:  # bwrap has joined the user namespace by now
                helper.kill()
                helper.wait()
        self.info = hello
        return ch

    def run(self, job: dict, timeout: float) -> dict:
        """Send ``job``; return the server's raw result dict.

        ``timeout`` bounds the wait for the answer (the server enforces the job's own wall
        limit; this is the backstop).  Raises TimeoutError if the server did not answer in
        time (it is killed), BackendError if it died or could not be started.
        """
        if self._shut:
            raise BackendError("worker was shut down")
        if self._ch is None:
            self._ch = self._start()
        lim = job["limits"]
        max_bytes = 4 * (2 * lim["output_bytes"] + (1 << 20)) // 3 + (1 << 16)
        try:
            # keys starting with '_' stay with the runner (the expected values of rewritten
            # tests must never enter the sandbox); the tests and tokens go in a second message
            # that the server forwards to the test program without reading it (the solution's
            # process is forked from the server, and must never have had them in memory)
            self._ch.send({k: v for k, v in job.items()
                           if not k.startswith("_") and k not in SECOND_MESSAGE})
            self._ch.send({k: job[k] for k in SECOND_MESSAGE if k in job})
            res = self._ch.recv(timeout, max_bytes)
        except (BackendError, TimeoutError):
            self.close(graceful=False)
            raise
        if "server_error" in res:
            self.close(graceful=False)
            raise BackendError(f"sandbox server error: {res['server_error']}")
        if not res.get("clean", True):
            log.warning("sandbox run left processes or files that could not be removed; restarting")
            self.close(graceful=False)
        return res

    @property
    def host_pid(self) -> int | None:
        """Host pid of the process that holds the sandbox (bwrap / server), None if not running."""
        proc = self._ch.proc if self._ch is not None else None
        return proc.pid if proc is not None else None

    def shutdown(self) -> None:
        """Close for good: later ``run`` calls raise BackendError instead of restarting."""
        self._shut = True
        self.close()

    def close(self, graceful: bool = True) -> None:
        """Stop the sandbox (everything in it dies with it); a later run starts a new one."""
        ch, self._ch = self._ch, None
        if ch is not None:
            ch.kill(graceful)
